package io.github.kvstore;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A small recursive-descent JSON reader for the tests (the JDK has none, and the suite
 * takes no dependency): objects become {@code LinkedHashMap<String, Object>} (in file
 * order), arrays {@code List<Object>}, strings {@code String}, numbers {@code Long} when
 * written as integers that fit and {@code Double} otherwise, {@code true}/{@code false}
 * {@code Boolean}, and {@code null} null. Anything else, trailing text included, is an
 * {@link IllegalArgumentException} that names the offset. (Not {@code Json}: that is the
 * library's own JSON writer, in the same package.)
 */
final class JsonReader {
    private final String s;
    private int i;

    private JsonReader(String s) {
        this.s = s;
    }

    static Object parse(String text) {
        JsonReader r = new JsonReader(text);
        Object v = r.value();
        r.space();
        if (r.i != r.s.length()) {
            throw r.error("trailing text");
        }
        return v;
    }

    private IllegalArgumentException error(String what) {
        return new IllegalArgumentException("JSON: " + what + " at offset " + i);
    }

    private void space() {
        while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) {
            i++;
        }
    }

    private char peek() {
        space();
        if (i >= s.length()) {
            throw error("unexpected end");
        }
        return s.charAt(i);
    }

    private void expect(char c) {
        if (peek() != c) {
            throw error("expected '" + c + "'");
        }
        i++;
    }

    private boolean word(String w) {
        if (s.startsWith(w, i)) {
            i += w.length();
            return true;
        }
        return false;
    }

    private Object value() {
        char c = peek();
        if (c == '{') {
            i++;
            Map<String, Object> m = new LinkedHashMap<>();
            if (peek() == '}') {
                i++;
                return m;
            }
            do {
                if (peek() != '"') {
                    throw error("expected a string key");
                }
                String k = string();
                expect(':');
                if (m.containsKey(k)) {
                    throw error("duplicate key " + k);
                }
                m.put(k, value());
            } while (comma('}'));
            return m;
        } else if (c == '[') {
            i++;
            List<Object> l = new ArrayList<>();
            if (peek() == ']') {
                i++;
                return l;
            }
            do {
                l.add(value());
            } while (comma(']'));
            return l;
        } else if (c == '"') {
            return string();
        } else if (word("true")) {
            return Boolean.TRUE;
        } else if (word("false")) {
            return Boolean.FALSE;
        } else if (word("null")) {
            return null;
        }
        return number();
    }

    /** After an element: true for a comma (another element follows), false for {@code close}. */
    private boolean comma(char close) {
        char c = peek();
        i++;
        if (c == ',') {
            return true;
        } else if (c == close) {
            return false;
        }
        i--;
        throw error("expected ',' or '" + close + "'");
    }

    private String string() {
        i++; // the opening quote
        StringBuilder b = new StringBuilder();
        while (true) {
            if (i >= s.length()) {
                throw error("unterminated string");
            }
            char c = s.charAt(i++);
            if (c == '"') {
                return b.toString();
            } else if (c < 0x20) {
                throw error("control character in a string");
            } else if (c != '\\') {
                b.append(c);
                continue;
            }
            if (i >= s.length()) {
                throw error("unterminated string");
            }
            char e = s.charAt(i++);
            switch (e) {
                case '"', '\\', '/' -> b.append(e);
                case 'b' -> b.append('\b');
                case 'f' -> b.append('\f');
                case 'n' -> b.append('\n');
                case 'r' -> b.append('\r');
                case 't' -> b.append('\t');
                case 'u' -> {
                    if (i + 4 > s.length()) {
                        throw error("short \\u escape");
                    }
                    try {
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                    } catch (NumberFormatException x) {
                        throw error("bad \\u escape");
                    }
                    i += 4;
                }
                default -> throw error("bad escape \\" + e);
            }
        }
    }

    private Number number() {
        int start = i;
        if (i < s.length() && s.charAt(i) == '-') {
            i++;
        }
        int digits = i;
        while (i < s.length() && Character.isDigit(s.charAt(i))) {
            i++;
        }
        if (i == digits || s.charAt(digits) == '0' && i - digits > 1) {
            i = start;
            throw error("expected a value");
        }
        boolean integer = true;
        if (i < s.length() && s.charAt(i) == '.') {
            integer = false;
            i++;
            int frac = i;
            while (i < s.length() && Character.isDigit(s.charAt(i))) {
                i++;
            }
            if (i == frac) {
                throw error("digits expected after '.'");
            }
        }
        if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
            integer = false;
            i++;
            if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) {
                i++;
            }
            int exp = i;
            while (i < s.length() && Character.isDigit(s.charAt(i))) {
                i++;
            }
            if (i == exp) {
                throw error("digits expected in the exponent");
            }
        }
        String text = s.substring(start, i);
        if (integer) {
            try {
                return Long.parseLong(text);
            } catch (NumberFormatException tooLong) {
                // falls through to a double
            }
        }
        return Double.parseDouble(text);
    }
}
