"""Colour maps, heatmap figures (SVG, raster cells) and line charts."""
