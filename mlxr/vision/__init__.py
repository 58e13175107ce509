"""Images in: bounded decoding (decode.py) and each architecture's preprocessing (preprocess.py),
numpy and Pillow only. The engine frontend calls these while it tokenizes a prompt."""
