"""The `hbmserve` command line: the top layer, importing everything below and imported by none."""
