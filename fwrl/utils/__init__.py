"""Helpers under every other layer (no torch): atomic file writes, typed settings.

Layers, lowest first: ``fwrl.errors`` and ``fwrl.utils`` < ``envs`` < ``kernels``
< ``memory_modules`` < ``agents`` < ``launch``; a module imports only from its
own layer or lower ones (``tests/unit/test_layers.py``).
"""
