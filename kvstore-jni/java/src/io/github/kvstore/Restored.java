package io.github.kvstore;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.Objects;

/**
 * What a store restored when it was made ({@link KVStore#restored()}): the step and extra
 * bytes given to the commit it resumed from ({@link KVStore#commit}).
 *
 * @param step the step committed
 * @param extra the program's own bytes given to the commit
 */
public record Restored(long step, byte[] extra) {
    /**
     * A record of its own copy of the bytes.
     *
     * @param step the step committed
     * @param extra the program's own bytes given to the commit (copied)
     */
    public Restored {
        extra = Objects.requireNonNull(extra, "extra").clone();
    }

    /**
     * The program's own bytes given to the commit.
     *
     * @return a copy of them
     */
    @Override
    public byte[] extra() {
        return extra.clone();
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Restored r && r.step == step && Arrays.equals(r.extra, extra);
    }

    @Override
    public int hashCode() {
        return Long.hashCode(step) * 31 + Arrays.hashCode(extra);
    }

    @Override
    public String toString() {
        return "Restored[step=" + step + ", extra=" + extra.length + " bytes]";
    }

    /** The record {@code nRestored}'s bytes say (NATIVES.md), or null. */
    static Restored of(byte[] raw) {
        if (raw == null) {
            return null;
        }
        long step = ByteBuffer.wrap(raw, 0, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
        return new Restored(step, Arrays.copyOfRange(raw, 8, raw.length));
    }
}
