package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The test suite's JSON reader ({@link JsonReader}), which {@link GoldenTest} relies on. */
class JsonReaderTest {
    @Test
    void readsEveryKindOfValue() {
        Object v = JsonReader.parse(
                " {\"a\": [1, -2, 3.5, -0.25e1, 1E2, 12345678901234567890], \"b\": {\"t\": true, \"f\": false, \"n\": null},"
                        + " \"e\": {}, \"l\": [], \"s\": \"x\"}\n");
        Map<?, ?> m = (Map<?, ?>) v;
        assertEquals(List.of("a", "b", "e", "l", "s"), new ArrayList<>(m.keySet()), "keys in file order");
        assertEquals(Arrays.asList(1L, -2L, 3.5, -2.5, 100.0, 1.2345678901234567e19), m.get("a"));
        Map<?, ?> b = (Map<?, ?>) m.get("b");
        assertEquals(Boolean.TRUE, b.get("t"));
        assertEquals(Boolean.FALSE, b.get("f"));
        assertTrue(b.containsKey("n"));
        assertNull(b.get("n"));
        assertEquals(Map.of(), m.get("e"));
        assertEquals(List.of(), m.get("l"));
        assertEquals("x", m.get("s"));
        assertEquals(7L, JsonReader.parse("7"));
        assertNull(JsonReader.parse(" null "));
    }

    @Test
    void readsStringEscapes() {
        assertEquals("q\" b\\ s/ \b\f\n\r\t é\u0001", JsonReader.parse("\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u00e9\\u0001\""));
        assertEquals("😀", JsonReader.parse("\"\\ud83d\\ude00\""), "a surrogate pair");
        // What the library's own writer escapes reads back as itself.
        String odd = "tab\t quote\" backslash\\ nl\n bell\u0007 ü";
        StringBuilder written = new StringBuilder();
        Json.string(written, odd);
        assertEquals(odd, JsonReader.parse(written.toString()));
    }

    @Test
    void rejectsMalformedText() {
        for (String bad : new String[] {
            "", "{", "[1,]", "[1 2]", "{\"a\" 1}", "{a: 1}", "{\"a\": 1,}", "\"open", "\"\\x\"", "\"\\u12\"",
            "01", "-", "1.", "1e", ".5", "tru", "nul", "[1] 2", "{\"a\": 1, \"a\": 2}", "\"a\nb\""
        }) {
            IllegalArgumentException e =
                    assertThrows(IllegalArgumentException.class, () -> JsonReader.parse(bad), "'" + bad + "'");
            assertTrue(e.getMessage().contains("at offset"), e.getMessage());
        }
    }
}
