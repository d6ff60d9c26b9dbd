"""Shuffled passes over a dataset's indices, reproducibly from the seed: what `uniform` draws, and what
`skip_flat_groups` draws from."""

import random


class Passes:
    """One pass after another over range(size), each shuffled (or in order, `shuffle=False`)."""

    def __init__(self, size: int, seed: int, shuffle: bool):
        self.size, self.shuffle = size, shuffle
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def next(self) -> int:
        if not self.order:
            self.order = list(range(self.size))
            if self.shuffle:
                self.rng.shuffle(self.order)
            else:  # indices are popped from the end: unshuffled, they come in the dataset's order, as in TRL
                self.order.reverse()
        return self.order.pop()

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]  # a checkpoint may have turned the tuple into lists
        self.rng.setstate((version, tuple(internal), gauss))
        self.order = list(state["order"])
