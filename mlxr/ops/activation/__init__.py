"""The gated activation act(gate) * up of the MLP: the dispatcher and torch reference
(activation.py) and the Triton kernel (activation_triton.py)."""
