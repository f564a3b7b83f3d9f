"""A stand-in for a training run: a few epochs of real arithmetic, reporting loss like Keras.

Its loss is smallest at lr=1e-2 and falls faster for a wider `width`, so a sweep over both
draws a readable objective chart; `epochs` (default 6) sets its length.
"""

from __future__ import annotations

import math

from gpumux.runtime import params, report

SAMPLES_PER_EPOCH = 2000

settings = params()
lr = float(settings.get("lr", 1e-2))
width = int(settings.get("width", 64))
epochs = int(settings.get("epochs", 6))
floor = 0.05 + 0.4 * math.log10(lr / 1e-2) ** 2 + 4.0 / width
for epoch in range(1, epochs + 1):
    checksum = sum(i * i for i in range(40_000 * max(1, width // 32)))
    loss = floor + (2.0 - floor) * math.exp(-epoch * width / 96)
    report(samples=SAMPLES_PER_EPOCH, step=epoch - 1, loss=loss, val_loss=loss * 1.1)
    print(f"epoch {epoch}/{epochs}: loss {loss:.4f} (checksum {checksum % 997})", flush=True)
