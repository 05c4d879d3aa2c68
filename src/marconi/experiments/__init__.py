"""Experiments: paper-figure reproductions (``marconi reproduce``) and studies (``marconi experiment …``)."""
