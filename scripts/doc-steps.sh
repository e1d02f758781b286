# Runs the steps that scripts/readme_projects.py wrote (PROJECTS/steps.tsv), in order,
# for scripts/test-user-projects.sh and scripts/test-doc-mpi.sh; sourced after
# scripts/suite.sh. Each run block is a test case (its commands in its folder, at most
# 15 minutes), and so is each prints block (every line of it printed by the folder's
# last run, as a terminal shows it). Logs: $logs/PREFIX-FOLDER.log.
#
#   run_doc_steps PROJECTS PREFIX
run_doc_steps() {
    local projects=$1 prefix=$2 kind dir file log rc missing_line want
    while IFS=$'\t' read -r kind dir file; do
        log=$logs/$prefix-$dir.log
        [ "$dir" = . ] && log=$logs/$prefix-install.log
        case $kind in
        run)
            echo "== $(head -n 1 "$file")" >>"$log"
            # The folder's last run alone is what its next prints block checks.
            rc=0
            (cd "$projects/$dir" && timeout -k 10 900 bash -euo pipefail "$file") </dev/null >"$log.last" 2>&1 || rc=$?
            cat "$log.last" >>"$log"
            if [ "$rc" -eq 0 ]; then
                pass "$dir: $(grep -v '^#' "$file" | head -n 1 | cut -c1-60)"
            else
                fail "$dir: $(grep -v '^#' "$file" | head -n 1 | cut -c1-60)" "$log"
            fi
            ;;
        prints)
            missing_line=
            # What a terminal shows: without colour escapes (Maven prints some even with -B).
            sed 's/\x1b\[[0-9;]*m//g' "$log.last" >"$log.plain" 2>/dev/null
            while IFS= read -r want; do
                [ -z "$want" ] && continue
                grep -qxF -- "$want" "$log.plain" || { missing_line=$want; break; }
            done <"$file"
            rm -f "$log.plain"
            if [ -z "$missing_line" ]; then
                pass "$dir prints what the document shows"
            else
                echo "    not printed: $missing_line" >>"$log"
                fail "$dir prints what the document shows (missing: $missing_line)" "$log"
            fi
            ;;
        esac
    done <"$projects/steps.tsv"
}
