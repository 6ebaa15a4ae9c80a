"""The Qt shell: the only package that imports PySide6 or pyqtgraph."""
