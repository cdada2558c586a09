"""Server: the TensorBoard plugin. `plugin` holds only HTTP (thin route handlers); `data_access`
reads through TensorBoard's data provider (both loaders), `heatmap` merges the layer x step
matrix, `export` writes CSV.
"""
