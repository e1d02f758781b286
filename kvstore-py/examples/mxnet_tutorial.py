"""MXNet's KVStore tutorial (docs/python/kvstore.md of MXNet 1.x), unchanged but for
``import kvstore.mxnet``: with it, ``mx.kv.create('local')`` is this project's store,
taking MXNet's NDArrays in place. The tutorial's Python 2 prints are Python 3 calls,
and its four GPUs are ``mx.cpu(i)`` contexts (this store takes MXNet arrays on the
CPU). Without the import line it runs on MXNet's own store and prints the same.

Run: ``python kvstore-py/examples/mxnet_tutorial.py`` (with mxnet 1.9.1 and kvstore).
"""

import mxnet as mx
import kvstore.mxnet  # noqa: F401  (registers this store for mx.kv.create)

# ## Basic Push and Pull
# ### Initialization
kv = mx.kv.create('local')  # create a local kv store.
shape = (2, 3)
kv.init(3, mx.nd.ones(shape) * 2)
a = mx.nd.zeros(shape)
kv.pull(3, out=a)
print(a.asnumpy())

# ### Push, Aggregation, and Updater
kv.push(3, mx.nd.ones(shape) * 8)
kv.pull(3, out=a)  # pull out the value
print(a.asnumpy())

gpus = [mx.cpu(i) for i in range(4)]  # the tutorial's mx.gpu(i)
b = [mx.nd.ones(shape, gpu) for gpu in gpus]
kv.push(3, b)
kv.pull(3, out=a)
print(a.asnumpy())


def update(key, input, stored):
    print("update on key: %d" % key)
    stored += input * 2


kv._set_updater(update)
kv.pull(3, out=a)
print(a.asnumpy())
kv.push(3, mx.nd.ones(shape))
kv.pull(3, out=a)
print(a.asnumpy())

# ### Pull
b = [mx.nd.ones(shape, gpu) for gpu in gpus]
kv.pull(3, out=b)
print(b[1].asnumpy())

# ## List Key-Value Pairs
keys = [5, 7, 9]
kv.init(keys, [mx.nd.ones(shape)] * len(keys))
kv.push(keys, [mx.nd.ones(shape)] * len(keys))
b = [mx.nd.zeros(shape)] * len(keys)
kv.pull(keys, out=b)
print(b[1].asnumpy())

# For multiple devices:
b = [[mx.nd.ones(shape, gpu) for gpu in gpus]] * len(keys)
kv.push(keys, b)
kv.pull(keys, out=b)
print(b[1][1].asnumpy())
