"""Rows of an image index made up for the index tests: awkward names, repeated contents, large sizes."""

import hashlib
import random

from tasks.contracts.image_index import Row

NAMES = ["a/b.png", "é/ü.jpg", "猫/1.png", "z.png", "A.png", "a/b~2.png", "ä.png", ""]


def rows(count: int, classes: int = 3) -> list[Row]:
    rng = random.Random(count)
    return [
        Row(
            path=f"{NAMES[i % 7]}.{i}",
            source_path=None if i % 4 == 0 else f"src/{i}.png",
            label=i % classes,
            sha256=hashlib.sha256(str(i % (count - 3)).encode()).hexdigest(),  # three images repeat a content
            size_bytes=rng.randrange(1 << 40),
            width=rng.randrange(1, 5000),
            height=rng.randrange(1, 5000),
            mode=rng.choice(["L", "RGB", "RGBA", "I;16"]),
        )
        for i in range(count)
    ]
