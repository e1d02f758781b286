{kvstore/ndarray org.apache.clojure-mxnet.ndarray/read-ndarray}
