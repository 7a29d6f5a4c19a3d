"""The contract: the abstract classes every engine implements (Store, Queue,
JobHandle, Subscription), the values they pass, and engine choice by URL
(docs/contract.md). Import them from :mod:`alkstore`.

The async classes (``*_async.py``: AsyncStore, AsyncQueue, AsyncJobHandle,
AsyncSubscription) are the hand-written source; the sync modules beside
them are generated from them by ``tools/async_to_sync.py``. ``threaded.py``
gives any sync engine the async contract (docs/async.md).
"""
