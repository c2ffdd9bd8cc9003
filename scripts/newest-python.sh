#!/usr/bin/env bash
# Prints the newest CPython 3 here (on PATH, or one pyenv installed but did not select), for
# the newest-versions job; python3 where there is no other.
roots=("")
command -v pyenv >/dev/null 2>&1 && roots+=("$(pyenv root)/versions")
for minor in 14 13 12 11; do
  if command -v "python3.$minor" >/dev/null 2>&1 && "python3.$minor" -c 'import venv' 2>/dev/null; then
    echo "python3.$minor"; exit 0
  fi
  for root in "${roots[@]:1}"; do
    for py in "$root"/3."$minor".*/bin/python3."$minor"; do
      if [ -x "$py" ] && "$py" -c 'import venv, ssl' 2>/dev/null; then echo "$py"; exit 0; fi
    done
  done
done
echo python3
