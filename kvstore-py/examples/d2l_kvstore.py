"""The code cells of d2l.ai's "Distributed Key-Value Store" notebook (MXNet), unchanged
but for ``import kvstore.mxnet``: with it, ``kv.create('local')`` is this project's
store, taking ``mxnet.np`` arrays in place. Left out: ``from d2l import mxnet as d2l``
(the notebook never uses it) and ``help(kv)`` (it prints MXNet's package help, with
its install path). The notebook's cell outputs are printed (``np.ones((2,3))``'s with
``repr``). The notebook already uses ``npx.cpu(i)`` as its devices. Without the import
line it runs on MXNet's own store and prints the same.

Run: ``python kvstore-py/examples/d2l_kvstore.py`` (with mxnet 1.9.1 and kvstore).
"""

import kvstore.mxnet  # noqa: F401  (registers this store for kv.create)
from mxnet import np, npx, kv

npx.set_np()

print(repr(np.ones((2, 3))))

kv = kv.create('local')  # Create a local kv store.
shape = (2, 3)
kv.init(3, np.ones(shape) * 2)
a = np.zeros(shape)
kv.pull(3, out = a)
print(a)

# ## Push, Aggregate, and Update
kv.push(3, np.ones(shape)*8)
kv.pull(3, out = a)  # Pull out the value
print(a.asnumpy())

devices = [npx.cpu(i) for i in range(4)]
b = [np.ones(shape, ctx=device) for device in devices]
kv.push(3, b)
kv.pull(3, out = a)
print(a)


def update(key, input, stored):
    print(f'update on key: {key}')
    stored += input * 2
kv._set_updater(update)
kv.pull(3, out=a)
print(a)

kv.push(3, np.ones(shape))
kv.pull(3, out=a)
print(a)

# ## Pull
b = [np.ones(shape, ctx=device) for device in devices]
kv.pull(3, out = b)
print(b[1])

# ## Handle a List of Key-Value Pairs
keys = [5, 7, 9]
kv.init(keys, [np.ones(shape)]*len(keys))
kv.push(keys, [np.ones(shape)]*len(keys))
b = [np.zeros(shape)]*len(keys)
kv.pull(keys, out = b)
print(b[1])

# For multiple devices:
b = [[np.ones(shape, ctx=device) for device in devices]] * len(keys)
kv.push(keys, b)
kv.pull(keys, out = b)
print(b[1][1])
