package io.github.kvstore;

import java.util.Map;

/**
 * The little JSON writing that {@link Optimizer#toJson()} and {@link LrScheduler#toJson()}
 * need (the format is in {@code kvstore-core/src/optimizer/spec.rs}). Non-finite numbers, which
 * JSON lacks, are written as the strings {@code "NaN"}, {@code "Infinity"} and
 * {@code "-Infinity"}, so that the native side can reject them by name.
 */
final class Json {
    private Json() {}

    static void string(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        // Lone surrogates pass as they are: Java strings reach Rust through
                        // JNI's modified UTF-8, which carries them, and serde_json rejects
                        // them with a message.
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    static void number(StringBuilder out, double x) {
        if (Double.isNaN(x)) {
            out.append("\"NaN\"");
        } else if (Double.isInfinite(x)) {
            out.append(x > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        } else if (x == Math.rint(x) && Math.abs(x) < 1e15) {
            // Whole numbers as integers: "2", not "2.0" (both parse; this reads better).
            out.append((long) x);
        } else {
            out.append(x);
        }
    }

    /** {@code "name": } */
    static void name(StringBuilder out, String name) {
        string(out, name);
        out.append(": ");
    }

    /** A JSON object of numbers. */
    static void numbers(StringBuilder out, Map<String, Double> m) {
        out.append('{');
        boolean first = true;
        for (Map.Entry<String, Double> e : m.entrySet()) {
            if (!first) {
                out.append(", ");
            }
            first = false;
            name(out, e.getKey());
            number(out, e.getValue());
        }
        out.append('}');
    }
}
