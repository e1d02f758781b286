package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.junit.jupiter.api.Test;

/**
 * The null contract of the public API: every public method of {@link KVStore} (and of
 * its {@link AsyncKVStore}, whose calls take their blocking twins' parameters),
 * {@link NDArray}, {@link Optimizer} (and its builders), {@link LrScheduler} and
 * {@link Context}, given {@code null} for a reference parameter, throws a
 * {@link NullPointerException} whose message is the parameter's name, before any native
 * call (it does so on a closed store or array too, where any native call would be
 * {@code DISPOSED}).
 *
 * <p>The methods are found by reflection, so a new public method must be listed in
 * {@link #PARAMETERS} (the jar is compiled without {@code -parameters}, so the names
 * come from here) or in {@link #NULLABLE}, or this test fails.
 */
class NullContractTest {
    /** The classes whose public methods keep the contract. */
    private static final List<Class<?>> CLASSES = List.of(KVStore.class, AsyncKVStore.class, StoreCalls.class, NDArray.class,
            RowSparse.class,
            Optimizer.class, Optimizer.Builder.class, Optimizer.Named.class, Optimizer.Sgd.class, Optimizer.Nag.class,
            Optimizer.Adam.class, Optimizer.AdaGrad.class, Optimizer.RmsProp.class, Optimizer.AdaDelta.class,
            Optimizer.Ftrl.class, Optimizer.Signum.class, Optimizer.Sgld.class, Optimizer.Dcasgd.class,
            Optimizer.Adamax.class, Optimizer.Nadam.class, Optimizer.Lamb.class, Optimizer.Lars.class, Optimizer.Ftml.class, Optimizer.Lbsgd.class,
            LrScheduler.class, Context.class);

    /** Each public method with reference parameters, then the names of those parameters. */
    private static final String PARAMETERS = """
            KVStore.create(String) kind
            KVStore.init(String,NDArray) key value
            KVStore.init(String[],NDArray[]) keys values
            KVStore.push(String,NDArray) key value
            KVStore.push(String,NDArray[]) key values
            KVStore.push(String,NDArray[],int) key values
            KVStore.push(String[],NDArray[]) keys values
            KVStore.push(String[],NDArray[],int) keys values
            KVStore.pull(String) key
            KVStore.pull(String,NDArray) key out
            KVStore.pull(String,NDArray[]) key outs
            KVStore.pull(String,NDArray[],int) key outs
            KVStore.pull(String[],NDArray[]) keys outs
            KVStore.pull(String[],NDArray[],int) keys outs
            KVStore.pushpull(String,NDArray) key value
            KVStore.pushpull(String,NDArray,NDArray) key value out
            KVStore.pushpull(String,NDArray[]) key values
            KVStore.pushpull(String,NDArray[],NDArray[]) key values outs
            KVStore.pushpull(String,NDArray[],NDArray[],int) key values outs
            KVStore.pushpull(String[],NDArray[]) keys values
            KVStore.pushpull(String[],NDArray[],NDArray[]) keys values outs
            KVStore.pushpull(String[],NDArray[],NDArray[],int) keys values outs
            KVStore.broadcast(String,NDArray,NDArray) key value out
            KVStore.broadcast(String,NDArray,NDArray[]) key value outs
            KVStore.broadcast(String,NDArray,NDArray[],int) key value outs
            KVStore.broadcast(String[],NDArray[],NDArray[]) keys values outs
            KVStore.broadcast(String[],NDArray[],NDArray[],int) keys values outs
            KVStore.initRowSparse(String,RowSparse) key value
            KVStore.initRowSparse(String[],RowSparse[]) keys values
            KVStore.pushRowSparse(String,RowSparse[]) key values
            KVStore.pushRowSparse(String[],RowSparse[],int) keys values
            KVStore.rowSparsePull(String,long[]) key rowIds
            KVStore.rowSparsePull(String,long[],int) key rowIds
            KVStore.stype(String) key
            RowSparse.of(NDArray,long[],int[]) data indices shape
            RowSparse.zeros(int[],DType) shape dtype
            RowSparse.fromDense(NDArray) dense
            KVStore.setOptimizer(Optimizer) optimizer
            KVStore.saveOptimizerStates(String) path
            KVStore.loadOptimizerStates(String) path
            KVStore.saveCheckpoint(String) path
            KVStore.loadCheckpoint(String) path
            KVStore.sendCommandToServers(int,String) body
            KVStore.setGradientCompression(Map) params
            KVStore.isCapable(String) capability
            KVStore.startTimeline(String) path
            KVStore.commit(long,byte[]) extra
            NDArray.zeros(int[]) shape
            NDArray.zeros(int[],Context,DType) shape ctx dtype
            NDArray.ones(int[]) shape
            NDArray.ones(int[],Context,DType) shape ctx dtype
            NDArray.full(int[],double) shape
            NDArray.full(int[],double,Context,DType) shape ctx dtype
            NDArray.array(float[],int[]) data shape
            NDArray.array(float[],int[],Context,DType) data shape ctx dtype
            NDArray.array(double[],int[]) data shape
            NDArray.array(double[],int[],Context,DType) data shape ctx dtype
            NDArray.array(int[],int[]) data shape
            NDArray.array(int[],int[],Context,DType) data shape ctx dtype
            NDArray.array(long[],int[]) data shape
            NDArray.array(long[],int[],Context,DType) data shape ctx dtype
            NDArray.wrap(ByteBuffer,int[],DType) buffer shape dtype
            NDArray.arange(double,double,double,Context,DType) ctx dtype
            NDArray.toFloatArray(float[]) dst
            NDArray.add(NDArray) other
            NDArray.sub(NDArray) other
            NDArray.mul(NDArray) other
            NDArray.div(NDArray) other
            NDArray.addInPlace(NDArray) other
            NDArray.subInPlace(NDArray) other
            NDArray.mulInPlace(NDArray) other
            NDArray.divInPlace(NDArray) other
            NDArray.copyTo(Context) ctx
            NDArray.asType(DType) dtype
            NDArray.copyFrom(NDArray) src
            NDArray.copyFrom(float[]) data
            NDArray.sameStorage(NDArray) other
            Optimizer.builder(String) name
            Optimizer.Builder.param(String,double) mxnetName
            Optimizer.Lbsgd.warmupStrategy(String) strategy
            Optimizer.Lbsgd.warmupStrategyCode(String) strategy
            Optimizer.Builder.lrMult(String,double) key
            Optimizer.Builder.wdMult(String,double) key
            LrScheduler.multiFactor(long[],double) steps
            """;

    /**
     * The parameters where null means something, as their Javadoc says: no updater (back
     * to the default), no schedule; and {@code equals}, which answers false.
     */
    private static final Set<String> NULLABLE = Set.of("KVStore.setUpdater(Updater)",
            "Optimizer.Builder.lrScheduler(LrScheduler)", "Optimizer.equals(Object)", "LrScheduler.equals(Object)",
            "Context.equals(Object)");

    private static String owner(Class<?> c) {
        return c.getName().substring(c.getPackageName().length() + 1).replace('$', '.');
    }

    private static String signature(Method m) {
        StringBuilder s = new StringBuilder(owner(m.getDeclaringClass())).append('.').append(m.getName()).append('(');
        Class<?>[] types = m.getParameterTypes();
        for (int i = 0; i < types.length; i++) {
            s.append(i == 0 ? "" : ",").append(types[i].getSimpleName());
        }
        return s.append(')').toString();
    }

    private static Map<String, List<String>> parameters() {
        Map<String, List<String>> out = new LinkedHashMap<>();
        for (String line : PARAMETERS.strip().split("\n")) {
            String[] words = line.strip().split(" ");
            out.put(words[0], List.of(Arrays.copyOfRange(words, 1, words.length)));
        }
        return out;
    }

    /** The public methods of the API classes that take a reference parameter. */
    private static List<Method> methodsWithReferenceParameters() {
        List<Method> out = new ArrayList<>();
        for (Class<?> c : CLASSES) {
            for (Method m : c.getDeclaredMethods()) {
                // (An interface's abstract methods are its implementations', checked there.)
                if (Modifier.isPublic(m.getModifiers()) && !m.isSynthetic() && !m.isBridge()
                        && (!c.isInterface() || m.isDefault())
                        && Arrays.stream(m.getParameterTypes()).anyMatch(t -> !t.isPrimitive())) {
                    out.add(m);
                }
            }
        }
        return out;
    }

    /** A valid argument of type {@code t}. */
    private static Object sample(Class<?> t, NDArray array) {
        if (t == int.class) {
            return 0;
        } else if (t == long.class) {
            return 0L;
        } else if (t == double.class) {
            return 0.0;
        } else if (t == boolean.class) {
            return false;
        } else if (t == String.class) {
            return "k";
        } else if (t == String[].class) {
            return new String[] {"k"};
        } else if (t == NDArray.class) {
            return array;
        } else if (t == NDArray[].class) {
            return new NDArray[] {array};
        } else if (t == RowSparse.class) {
            return RowSparse.of(array, new long[] {0, 1}, 2, 3);
        } else if (t == RowSparse[].class) {
            return new RowSparse[] {RowSparse.of(array, new long[] {0, 1}, 2, 3)};
        } else if (t == int[].class) {
            return new int[] {2, 3};
        } else if (t == long[].class) {
            return new long[] {1, 2};
        } else if (t == float[].class) {
            return new float[6];
        } else if (t == double[].class) {
            return new double[6];
        } else if (t == ByteBuffer.class) {
            // The bytes of the sample shape {2, 3} in float32, as NDArray.wrap wants them.
            return ByteBuffer.allocateDirect(24).order(ByteOrder.nativeOrder());
        } else if (t == Context.class) {
            return Context.cpu();
        } else if (t == DType.class) {
            return DType.FLOAT32;
        } else if (t == Map.class) {
            return Map.of();
        } else if (t == Optimizer.class) {
            return Optimizer.sgd().build();
        } else if (t == LrScheduler.class) {
            return LrScheduler.factor(1, 0.5);
        }
        throw new AssertionError("no sample value of " + t + ": add one");
    }

    /** Calls {@code m} on {@code receiver} with {@code args}; returns what it threw, or null. */
    private static Throwable thrownBy(Method m, Object receiver, Object[] args) {
        try {
            m.invoke(receiver, args);
            return null;
        } catch (InvocationTargetException e) {
            return e.getCause();
        } catch (IllegalAccessException e) {
            throw new AssertionError(e);
        }
    }

    @Test
    void everyPublicMethodRejectsANullArgumentNamingTheParameterBeforeAnyNativeCall() {
        Map<String, List<String>> parameters = parameters();
        Set<String> checked = new TreeSet<>();
        KVStore closed = KVStore.create();
        closed.close();
        NDArray closedArray = NDArray.ones(2, 3);
        closedArray.close();
        try (KVStore open = KVStore.create();
                NDArray array = NDArray.ones(2, 3)) {
            open.init("k", array);
            for (Method m : methodsWithReferenceParameters()) {
                String sig = signature(m);
                if (NULLABLE.contains(sig)) {
                    continue;
                }
                // A non-blocking twin (kv.async().push) takes its blocking twin's parameters,
                // and so do the forms both have (StoreCalls's).
                String listed = sig.replace("AsyncKVStore.", "KVStore.").replace("StoreCalls.", "KVStore.");
                List<String> names = parameters.get(listed);
                assertNotNull(names, () -> sig + " is not in NullContractTest.PARAMETERS: add its parameters' names");
                List<Object> receivers = new ArrayList<>();
                if (Modifier.isStatic(m.getModifiers())) {
                    receivers.add(null);
                } else if (m.getDeclaringClass() == KVStore.class) {
                    receivers.add(open);
                    receivers.add(closed);
                } else if (m.getDeclaringClass() == AsyncKVStore.class) {
                    receivers.add(open.async());
                    receivers.add(closed.async());
                } else if (m.getDeclaringClass() == StoreCalls.class) {
                    receivers.add(open);
                    receivers.add(closed);
                    receivers.add(open.async());
                    receivers.add(closed.async());
                } else if (m.getDeclaringClass() == NDArray.class) {
                    receivers.add(array);
                    receivers.add(closedArray);
                } else if (m.getDeclaringClass() == Optimizer.Builder.class) {
                    receivers.add(Optimizer.sgd());
                } else if (m.getDeclaringClass() == Optimizer.Lbsgd.class) {
                    receivers.add(Optimizer.lbsgd());
                } else {
                    fail("no receiver for " + sig + ": add one");
                }
                Class<?>[] types = m.getParameterTypes();
                int ref = 0;
                for (int i = 0; i < types.length; i++) {
                    if (types[i].isPrimitive()) {
                        continue;
                    }
                    assertTrue(ref < names.size(), () -> sig + ": PARAMETERS names too few parameters");
                    String name = names.get(ref++);
                    for (Object receiver : receivers) {
                        Object[] args = new Object[types.length];
                        for (int j = 0; j < types.length; j++) {
                            args[j] = j == i ? null : sample(types[j], array);
                        }
                        Throwable t = thrownBy(m, receiver, args);
                        String call = sig + " with null " + name + (receiver == closed || receiver == closedArray
                                || receiver == closed.async()
                                ? " on a closed receiver" : "");
                        if (!(t instanceof NullPointerException)) {
                            throw new AssertionError(call + " threw " + t + ", not a NullPointerException", t);
                        }
                        assertEquals(name, t.getMessage(), call);
                    }
                }
                assertEquals(names.size(), ref, () -> sig + ": PARAMETERS names too many parameters");
                checked.add(sig.replace("StoreCalls.", "KVStore."));
            }
            Set<String> stale = new TreeSet<>(parameters.keySet());
            stale.removeAll(checked);
            assertEquals(Set.of(), stale, "PARAMETERS lists methods that are gone");
            // The store and array a null never reached are unchanged.
            try (NDArray value = open.pull("k")) {
                Fixtures.assertAll(1f, value);
            }
            assertEquals(List.of("k"), List.of(open.keys()));
        }
    }

    @Test
    void theParametersThatTakeNullSayWhatItMeans() {
        try (KVStore kv = KVStore.create(); NDArray one = NDArray.ones(1); NDArray out = NDArray.zeros(1)) {
            kv.init("k", one).setUpdater((key, index, merged, stored) -> stored.addInPlace(merged));
            kv.setUpdater(null).push("k", one).pull("k", out);
            Fixtures.assertAll(1f, out);
        }
        Optimizer o = Optimizer.sgd().lrScheduler(LrScheduler.factor(1, 0.5)).lrScheduler(null).build();
        assertTrue(o.lrScheduler().isEmpty());
        assertTrue(!Context.cpu().equals(null) && !o.equals(null) && !LrScheduler.factor(1, 0.5).equals(null));
    }
}
