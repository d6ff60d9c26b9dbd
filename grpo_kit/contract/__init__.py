"""What a plugin may import, and nothing else: the kinds, hooks, errors and helpers of the contract."""
