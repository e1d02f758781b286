"""MXNet's KVStore tutorial (docs/python/kvstore.md of MXNet 1.x), with this store in
place of ``mx.kv`` and numpy in place of ``mx.nd``: every step prints what the
tutorial shows. The four GPUs of the tutorial become four numpy arrays (the store
sums values wherever they are).

Run: ``python kvstore-py/examples/tutorial.py`` (after ``pip install ./kvstore-py``).
"""

import numpy as np

import kvstore as kv

# ## Basic Push and Pull
# ### Initialization
kv = kv.create("local")  # create a local kv store.
shape = (2, 3)
kv.init(3, np.ones(shape) * 2)
a = np.zeros(shape)
kv.pull(3, out=a)
print(a)

# ### Push, Aggregation, and Updater
kv.push(3, np.ones(shape) * 8)
kv.pull(3, out=a)  # pull out the value
print(a)

devices = range(4)  # the tutorial's four GPUs
b = [np.ones(shape) for _ in devices]
kv.push(3, b)
kv.pull(3, out=a)
print(a)


def update(key, input, stored):
    print("update on key: %d" % key)
    stored += input * 2


kv._set_updater(update)
kv.pull(3, out=a)
print(a)
kv.push(3, np.ones(shape))
kv.pull(3, out=a)
print(a)

# ### Pull
b = [np.ones(shape) for _ in devices]
kv.pull(3, out=b)
print(b[1])

# ## List Key-Value Pairs
keys = [5, 7, 9]
kv.init(keys, [np.ones(shape)] * len(keys))
kv.push(keys, [np.ones(shape)] * len(keys))
b = [np.zeros(shape)] * len(keys)
kv.pull(keys, out=b)
print(b[1])

# For multiple devices:
b = [[np.ones(shape) for _ in devices]] * len(keys)
kv.push(keys, b)
kv.pull(keys, out=b)
print(b[1][1])
