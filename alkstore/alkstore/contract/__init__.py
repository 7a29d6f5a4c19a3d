"""The contract: the abstract classes every engine implements (Store, Queue,
JobHandle, Subscription), the values they pass, and engine choice by URL
(docs/contract.md). Import them from :mod:`alkstore`.
"""
