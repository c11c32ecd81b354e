"""The ranker's feature store: a SQLite table behind an in-process LRU cache.

Hits and misses are real: a hit is a dictionary lookup; a miss runs a real query on the
SQLite table and then waits a seeded, deterministic delay that stands for the network
round trip to a remote store (Redis, Feast, DynamoDB). The cache is warmed at start-up
with the popular users, as a deploy would, so release v1 misses only on the rare cold
user; disabling the cache (the ``cache`` regression) sends every lookup to the store.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
from collections import OrderedDict

import numpy as np

USER_COUNT = 20_000
"""Rows in the ``user_features`` table."""
HOT_USERS = 256
"""Users 0..HOT_USERS-1 get almost all the traffic (see :mod:`tracekit.demo.loadgen`)."""
FEATURE_DIM = 32
"""Length of one user's (and one item's) feature vector."""
ITEM_COUNT = 5_000
"""Items in the catalogue (rows of the model's embedding table)."""
CANDIDATES = 32
"""Candidate items per request."""
CACHE_CAPACITY = 1024
"""Entries the LRU cache holds (the hot users fit, the cold ones churn)."""
STORE_BASE_MS = 40.0
"""Minimum round trip to the remote store on a miss."""
STORE_JITTER_MS = 20.0
"""Mean of the exponential part of a miss's round trip."""
STORE_MAX_MS = 150.0
"""Cap on a miss's round trip (the client's timeout would fire beyond it)."""


class LRUCache:
    """A bounded mapping that evicts the least recently used entry."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[int, np.ndarray] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: int) -> np.ndarray | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: int, value: np.ndarray) -> None:
        if self.capacity <= 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)


def _build_table(con: sqlite3.Connection, seed: int) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((USER_COUNT, FEATURE_DIM)).astype(np.float32)
    con.execute("CREATE TABLE user_features (user_id INTEGER PRIMARY KEY, vec BLOB NOT NULL)")
    con.executemany(
        "INSERT INTO user_features (user_id, vec) VALUES (?, ?)",
        ((i, vectors[i].tobytes()) for i in range(USER_COUNT)),
    )
    con.commit()


class FeatureStore:
    """User features: cache first, then the table plus the remote round trip."""

    def __init__(self, *, cache_enabled: bool = True, seed: int = 0) -> None:
        self.cache = LRUCache(CACHE_CAPACITY if cache_enabled else 0)
        self.cache_enabled = cache_enabled
        # One connection shared by the event loop and the warm-up; the lock keeps SQLite's
        # single-connection rule even if a caller moves lookups to a thread.
        self._con = sqlite3.connect(":memory:", check_same_thread=False)
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        _build_table(self._con, seed)
        self.hits = 0
        self.misses = 0

    def close(self) -> None:
        self._con.close()

    def warm(self, users: int = HOT_USERS) -> int:
        """Load the popular users into the cache in one query; returns how many."""
        if not self.cache_enabled:
            return 0
        with self._lock:
            rows = self._con.execute(
                "SELECT user_id, vec FROM user_features WHERE user_id < ? ORDER BY user_id",
                (users,),
            ).fetchall()
        for user_id, blob in rows:
            self.cache.put(int(user_id), np.frombuffer(blob, dtype=np.float32))
        return len(rows)

    def is_cached(self, user_id: int) -> bool:
        """Whether a lookup right now would hit (does not touch the LRU order)."""
        return self.cache_enabled and user_id in self.cache

    def _query(self, user_id: int) -> np.ndarray:
        with self._lock:
            row = self._con.execute(
                "SELECT vec FROM user_features WHERE user_id = ?", (user_id % USER_COUNT,)
            ).fetchone()
        if row is None:  # only reachable if the table was altered; keep the request going
            return np.zeros(FEATURE_DIM, dtype=np.float32)
        return np.frombuffer(row[0], dtype=np.float32)

    def _round_trip_s(self) -> float:
        ms = STORE_BASE_MS + self._rng.expovariate(1.0 / STORE_JITTER_MS)
        return min(ms, STORE_MAX_MS) / 1000.0

    async def get(self, user_id: int) -> tuple[np.ndarray, bool]:
        """The user's feature vector and whether it came from the cache."""
        if self.cache_enabled:
            cached = self.cache.get(user_id)
            if cached is not None:
                self.hits += 1
                return cached, True
        self.misses += 1
        vector = self._query(user_id)
        await asyncio.sleep(self._round_trip_s())
        self.cache.put(user_id, vector)
        return vector, False
