"""The KV cache: the device blocks, the host and disk tiers behind them, and the copies between them."""
