"""The disk tier's layout: Zarr v3 stores in xarray's DataTree encoding, and `open_outputs`."""
