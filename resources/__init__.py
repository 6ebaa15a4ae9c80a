"""attnviz's non-code files: the icon and the example scenarios.

This folder is installed as the package ``attnviz.resources`` (setup.py maps it), so
that ``importlib.resources`` finds it in a wheel and in an editable install alike;
``attnviz.assets`` is the one place that looks files up in it.
"""
