package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertAll;
import static io.github.kvstore.Fixtures.assertCode;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The timeline and the store's counters from Java. */
class TimelineTest {
    @Test
    void aLocalStoreWritesItsCallsAndCountsThem(@TempDir Path dir) throws Exception {
        Path path = dir.resolve("trace.json");
        try (KVStore kv = KVStore.create("local");
                NDArray ones = NDArray.ones(new int[] {4});
                NDArray out = NDArray.zeros(new int[] {4})) {
            kv.startTimeline(path.toString());
            kv.init(new String[] {"a", "b"}, new NDArray[] {ones, ones});
            kv.push(new String[] {"a", "b", "a"}, new NDArray[] {ones, ones, ones}, 0);
            kv.pull("a", out);
            assertEquals(path.toString(), kv.stopTimeline());
            assertNull(kv.stopTimeline(), "stopped already");
            assertAll(2f, out);

            @SuppressWarnings("unchecked")
            Map<String, Object> trace = (Map<String, Object>) JsonReader.parse(Files.readString(path));
            @SuppressWarnings("unchecked")
            List<Map<String, Object>> events = (List<Map<String, Object>>) trace.get("traceEvents");
            long pushes = events.stream().filter(e -> "push".equals(e.get("name")) && "X".equals(e.get("ph"))).count();
            assertEquals(1, pushes);

            Stats s = kv.stats();
            assertEquals(Map.of("init", 1L, "push", 1L, "pull", 1L), s.calls());
            assertEquals(Map.of("init", 2L, "push", 3L, "pull", 1L), s.keys());
            assertEquals(48, s.bytesPushed());
            assertEquals(16, s.bytesPulled());
            assertEquals(0, s.wireBytesSent());
            assertEquals(List.of(), s.ranks());
            assertTrue(s.phaseSeconds().get("sum") > 0, s.phaseSeconds().toString());
            assertEquals(new Stats.Held(32, 0, 0), s.held());
            kv.resetStats();
            assertEquals(Map.of(), kv.stats().calls());
            assertEquals(0, kv.stats().bytesPushed());
            assertEquals(32, kv.stats().held().values());
        }
    }

    /** A program that ends without closing its store or stopping the timeline. */
    static final class KeepsItsStore {
        public static void main(String[] args) {
            KVStore kv = KVStore.create("local");
            NDArray ones = NDArray.ones(new int[] {4});
            kv.init("w", ones).push("w", ones);
        }
    }

    @Test
    void theFileOfKvstoreTimelineIsWholeWhenTheProgramEnds(@TempDir Path dir) throws Exception {
        Path path = dir.resolve("trace.json");
        ChildJvm.Result r = ChildJvm.run(KeepsItsStore.class, List.of(),
                Map.of("KVSTORE_TIMELINE", path.toString()), 120);
        assertEquals(0, r.exit, r.toString());
        @SuppressWarnings("unchecked")
        Map<String, Object> trace = (Map<String, Object>) JsonReader.parse(Files.readString(path));
        @SuppressWarnings("unchecked")
        List<Map<String, Object>> events = (List<Map<String, Object>>) trace.get("traceEvents");
        List<Object> calls = events.stream()
                .filter(e -> "call".equals(e.get("cat")) && "X".equals(e.get("ph")))
                .map(e -> e.get("name"))
                .toList();
        assertEquals(List.of("init", "push"), calls);
    }

    @Test
    void aTimelineThatCannotBeMadeIsAnIoErrorAndChangesNothing(@TempDir Path dir) {
        try (KVStore kv = KVStore.create("local"); NDArray ones = NDArray.ones(new int[] {2})) {
            assertCode(KVStoreException.Code.IO, () -> kv.startTimeline(dir.resolve("missing/trace.json").toString()));
            assertNull(kv.stopTimeline());
            kv.init("w", ones).push("w", ones);
            assertEquals(1L, kv.stats().calls().get("push"));
        }
    }
}
