"""The batched low-rank add of LoRA adapters: y += B[slot] (A[slot] x) per token."""
