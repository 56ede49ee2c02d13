"""The published methods SSD is measured against (`ssd-bench peers`), apart from the engine the product runs.

Each is a `DecodingStrategy` listed in `decoding.catalog.PEERS` and made by name like the engine's own
(`make_strategy("sjd")`). The 1-D ones (sjd, sjd-pac, gsd, mtp1d) run on `window.WindowRun`, which shares the
engine's sliding window (`decoding/sliding.py`) with the `exact` frontier: the peers import the engine, never the
other way round.
"""
