#!/usr/bin/env bash
# Installs what the JVM side needs from Debian, if missing: a JDK 17 (javac, jar),
# Clojure 1.11 with test.check, and the JUnit 5 console launcher. No Maven Central.
set -euo pipefail
need=()
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
[ -f /usr/share/java/clojure.jar ] || need+=(clojure)
ls /usr/share/java/test.check*.jar >/dev/null 2>&1 || need+=(libtest-check-clojure)
[ -f /usr/share/java/junit-platform-console-standalone.jar ] || need+=(junit5)
[ ${#need[@]} -eq 0 ] && exit 0
exec bash "$(dirname "$0")/apt-install.sh" "${need[@]}"
