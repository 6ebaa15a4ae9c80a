"""pyqtgraph as the app's charts use it (the Experiments and RoPE docks): dark ink on
white, like the heatmaps and the exported figures."""

import pyqtgraph as pg

pg.setConfigOptions(background="w", foreground="#222222", antialias=False)

__all__ = ["pg"]
