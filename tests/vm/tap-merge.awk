# tests/vm/tap-merge.awk: turns the guest's ttyS1 records (guest-init.sh) into
# one TAP stream: "1..N", then every scenario's results renumbered and named
# "<scenario>: <name>". Adds a failing test for whatever went wrong around
# the results: setup failed, a scenario timed out, exited non-zero with no
# failing test, printed no result or a wrong plan, left the topology broken,
# or never finished.
# Variables: scenarios (space-separated names, in run order), stopped (why
# the guest stopped, when it did not finish). Exit 0 only if all passed.
function emit(s) { out[++nout] = s }
function result(ok, desc) {
  n++
  emit((ok ? "ok " : "not ok ") n " - " desc)
  if (!ok) failed++
}
BEGIN { marker = "@@TPFVM@@ "; nsc = split(scenarios, order, " ") }
{
  sub(/\r+$/, "")
  i = index($0, marker)
  if (!i) next
  rec = substr($0, i + length(marker))
  kind = rec; sub(/ .*/, "", kind)
  rest = substr(rec, length(kind) + 2)
  if (kind == "setup") {
    if (rest == "ok") { setup = 1; result(1, "vm: guest booted, rxe0..rxe3 ACTIVE with IPv4 GIDs on two rails") }
    else { setup = -1; sub(/^fail /, "", rest); result(0, "vm: guest setup failed: " rest) }
  } else if (kind == "begin") {
    cur = rest; started[cur] = 1; count[cur] = 0; bad[cur] = 0; plan[cur] = -1
  } else if (kind == "line") {
    s = rest; sub(/ .*/, "", s); line = substr(rest, length(s) + 2)
    if (line ~ /^(not )?ok([ \t]|$)/) {
      isok = (line !~ /^not /)
      sub(/^(not )?ok[ \t]*[0-9]*[ \t]*(-[ \t]*)?/, "", line)
      count[s]++
      if (!isok && line ~ /#[ \t]*[Tt][Oo][Dd][Oo]/) { n++; emit("not ok " n " - " s ": " line); next }
      if (!isok) bad[s]++
      result(isok, s ": " line)
    } else if (line ~ /^1\.\.[0-9]+/) {
      p = line; sub(/^1\.\./, "", p); plan[s] = p + 0
      if (plan[s] == 0) { skipall[s] = 1; why = line; sub(/^1\.\.0[ \t]*#?[ \t]*/, "", why)
        n++; emit("ok " n " - " s " # SKIP " why) }
    } else if (line ~ /^Bail out!/) {
      bad[s]++; result(0, s ": " line)
    } else emit(line)
  } else if (kind == "end") {
    split(rest, f, " "); s = f[1]; rc = f[2]; secs = f[3]; ended[s] = 1
    emit("# " s ": finished with status " rc " after " secs " s")
    if (rc == 124 || rc == 137) result(0, s ": timed out after " secs " s (vm-timeout / TPF_VM_SCENARIO_TIMEOUT)")
    else if (rc != 0 && bad[s] == 0) result(0, s ": exited with status " rc " without a failing test")
    if (count[s] == 0 && !skipall[s] && rc == 0) result(0, s ": printed no TAP result")
    if (plan[s] > 0 && plan[s] != count[s]) result(0, s ": planned " plan[s] " tests, ran " count[s])
  } else if (kind == "broken") {
    s = rest; sub(/ .*/, "", s)
    result(0, s ": left the RDMA topology broken (repaired for the next one): " substr(rest, length(s) + 2))
  } else if (kind == "done") done = 1
}
END {
  if (!setup) result(0, "vm: guest never reported its setup (" stopped ")")
  for (k = 1; k <= nsc; k++) {
    s = order[k]
    if (ended[s]) continue
    if (setup < 0) result(0, s ": not run, guest setup failed")
    else if (started[s]) result(0, s ": did not finish (" stopped ")")
    else result(0, s ": never started (" stopped ")")
  }
  print "1.." n
  for (k = 1; k <= nout; k++) print out[k]
  exit (failed > 0 || n == 0)
}
