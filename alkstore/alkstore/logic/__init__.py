"""The shared pure logic every engine and the runtime use, written once:
validation, ``QueueOpts`` and option resolution, backoff, durations, the
payload codec, the injected clock, schedule specs (docs/contract.md §2, §3).
It imports nothing else of alkstore but :mod:`alkstore.errors`.
"""
