"""attnviz: a desktop lab for transformer attention.

Importing the package pulls in neither Qt nor torch; see ``attnviz.core`` for the maths.
"""

__version__ = "0.1.0"
