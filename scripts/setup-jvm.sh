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
echo "installing ${need[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
for attempt in 1 2 3 4 5 6; do
    # Another apt may hold the lock for a while: retry.
    if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null; then
        exit 0
    fi
    echo "apt-get failed (attempt $attempt), retrying in 10 s"
    sleep 10
done
echo "could not install ${need[*]}" >&2
exit 1
