"""The shared pure logic every engine and the runtime use, written once:
validation, option resolution, backoff, durations, the payload codec, the
injected clock, schedule specs (docs/contract.md §2, §3).
"""
