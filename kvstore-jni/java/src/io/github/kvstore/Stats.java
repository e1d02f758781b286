package io.github.kvstore;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What a store did since it was made or {@link KVStore#resetStats()} ({@link
 * KVStore#stats()}).
 *
 * @param calls calls by kind ({@code "init"}, {@code "push"}, {@code "pull"}, {@code
 *     "pushpull"}, {@code "broadcast"}, {@code "push_row_sparse"}, {@code
 *     "pull_row_sparse"}); kinds never called are absent
 * @param keys keys by kind, summed over the calls (a key given twice counts twice)
 * @param bytesPushed bytes of the values pushed by calls that passed their checks
 * @param bytesPulled bytes of the outs pulled into
 * @param wireBytesSent bytes this worker sent to the others ({@code dist_sync}: an allreduce
 *     of S bytes over n workers moves 2(n-1)/n S each way)
 * @param wireBytesReceived bytes this worker received from the others
 * @param phaseSeconds seconds in each phase of the calls: {@code queued}, {@code inputs}
 *     (waiting for other calls' writes to the call's arrays), {@code sum}, {@code wire},
 *     {@code update}, {@code copy}, {@code ranks} (waiting at a collective for the other
 *     workers)
 * @param collectives under {@code dist_sync}, the collectives whose arrivals were compared
 * @param ranks under {@code dist_sync}, each worker in rank order (the same on every worker)
 * @param held the bytes the store holds on this worker now (not a counter: {@link
 *     KVStore#resetStats()} leaves it)
 */
public record Stats(
        Map<String, Long> calls,
        Map<String, Long> keys,
        long bytesPushed,
        long bytesPulled,
        long wireBytesSent,
        long wireBytesReceived,
        Map<String, Double> phaseSeconds,
        long collectives,
        List<Rank> ranks,
        Held held) {

    /**
     * The bytes a store holds on this worker, by what they are for.
     *
     * @param values the keys' values, and the copies a custom updater works on
     * @param state the optimizer's state and the f32 master copies of f16/bf16 weights
     *     (under {@code dist_sync} with owners, this worker's parts only)
     * @param buffers the buffers pushes are summed into, and gradient compression's residuals
     */
    public record Held(long values, long state, long buffers) {}

    /**
     * One worker's arrivals at the collectives of a {@code dist_sync} store.
     *
     * @param rank the worker's rank
     * @param heldUpSeconds how long it held the others up, in all: at each collective where
     *     it arrived last, its arrival minus the next-latest one (what names the slowest
     *     worker)
     * @param last at how many collectives it arrived last, more than 1 ms after the median of
     *     the others
     * @param meanLatenessSeconds its mean lateness: its arrival minus the median of the
     *     others' (negative when early)
     */
    public record Rank(int rank, double heldUpSeconds, long last, double meanLatenessSeconds) {}

    /** The kinds of call, in the order of {@code nStats}' longs (NATIVES.md). */
    static final String[] KINDS = {
        "init", "push", "pull", "pushpull", "broadcast", "push_row_sparse", "pull_row_sparse"
    };

    /** The phases, in the order of {@code nStats}' longs. */
    static final String[] PHASES = {"queued", "inputs", "sum", "wire", "update", "copy", "ranks"};

    /** The counters {@code nStats} returns, as a record. */
    static Stats of(long[] raw) {
        int at = 8;
        Map<String, Long> calls = new LinkedHashMap<>();
        Map<String, Long> keys = new LinkedHashMap<>();
        for (String kind : KINDS) {
            if (raw[at] > 0) {
                calls.put(kind, raw[at]);
                keys.put(kind, raw[at + 1]);
            }
            at += 2;
        }
        Map<String, Double> phases = new LinkedHashMap<>();
        for (String phase : PHASES) {
            phases.put(phase, raw[at++] / 1e9);
        }
        int n = (int) raw[at++];
        List<Rank> ranks = new ArrayList<>(n);
        for (int r = 0; r < n; r++, at += 3) {
            ranks.add(new Rank(r, raw[at] / 1e9, raw[at + 1], raw[at + 2] / 1e9));
        }
        return new Stats(
                Collections.unmodifiableMap(calls),
                Collections.unmodifiableMap(keys),
                raw[0],
                raw[1],
                raw[2],
                raw[3],
                Collections.unmodifiableMap(phases),
                raw[4],
                List.copyOf(ranks),
                new Held(raw[5], raw[6], raw[7]));
    }
}
