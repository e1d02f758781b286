package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertCode;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Commits from Java: a job run again with its name resumes from its last commit. */
class CommitTest {
    /** A job of three steps that commits each; run again, it resumes after its last. */
    static final class Job {
        public static void main(String[] args) {
            KVStore kv = KVStore.create("local");
            NDArray ones = NDArray.ones(new int[] {4});
            Restored r = kv.restored();
            long start = 0;
            if (r == null) {
                kv.init("w", NDArray.zeros(new int[] {4}));
            } else {
                System.out.println("restored " + r.step() + " " + new String(r.extra(), StandardCharsets.UTF_8));
                start = r.step() + 1;
            }
            for (long step = start; step < Long.parseLong(args[0]); step++) {
                kv.push("w", ones);
                kv.commit(step, ("loader at " + step).getBytes(StandardCharsets.UTF_8));
            }
            NDArray out = NDArray.zeros(new int[] {4});
            kv.pull("w", out);
            System.out.println("w " + out.toFloatArray()[0]);
        }
    }

    @Test
    void aJobRunAgainResumesFromItsLastCommit(@TempDir Path dir) throws Exception {
        Map<String, String> env = Map.of("KVSTORE_JOB", "java-job", "KVSTORE_COMMIT_DIR", dir.toString());
        ChildJvm.Result first = ChildJvm.run(Job.class, List.of(), env, 120, "2");
        assertEquals(0, first.exit, first.toString());
        ChildJvm.Result again = ChildJvm.run(Job.class, List.of(), env, 120, "3");
        assertEquals(0, again.exit, again.toString());
        assertEquals("restored 1 loader at 1\nw 1.0\n", again.out, again.toString());
    }

    @Test
    void aStoreWithoutAJobNameCannotCommit() {
        try (KVStore kv = KVStore.create("local"); NDArray ones = NDArray.ones(new int[] {2})) {
            kv.init("w", ones);
            assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> kv.commit(0, new byte[] {1}));
            assertNull(kv.restored());
        }
    }

    @Test
    void aRestoredRecordKeepsItsOwnBytes() {
        byte[] extra = {1, 2};
        Restored r = new Restored(3, extra);
        extra[0] = 9;
        assertArrayEquals(new byte[] {1, 2}, r.extra());
        assertEquals(new Restored(3, new byte[] {1, 2}), r);
    }
}
