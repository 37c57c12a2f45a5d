"""Warning delivery: a model told the same thing on every call learns to ignore it.

For each warning key the first warning is delivered; after that only when
`count // 10` rises. The gateway keeps at most 256 keys per run, dropping the
oldest; so do we.
"""

from __future__ import annotations

BUCKET_SIZE = 10
MAX_KEYS = 256


def should_deliver(buckets: dict[str, int], key: str, count: int) -> bool:
    bucket = count // BUCKET_SIZE
    last = buckets.get(key)
    if last is not None and bucket <= last:
        return False
    buckets[key] = bucket
    if len(buckets) > MAX_KEYS:
        del buckets[next(iter(buckets))]
    return True
