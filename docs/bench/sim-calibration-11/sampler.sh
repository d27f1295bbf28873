#!/bin/bash
# every ~12 s: the load average, the machine's busy share over 2 s, and the processes over 5% CPU in those 2 s
while true; do
  top -b -n 2 -d 2 -w 220 -c > /tmp/calq-top.txt 2>/dev/null
  echo "== $(date -u +%T) $(cat /proc/loadavg) | $(awk '/^%Cpu/{n++} n==2 && /^%Cpu/{print; exit}' /tmp/calq-top.txt)"
  awk '/^top -/{n++} n==2 && $1 ~ /^[0-9]+$/ && $9+0 > 5 {printf "  %s ni %s cpu %s ", $1, $4, $9; for (i=12;i<=NF && i<20;i++) printf "%s ", $i; print ""}' /tmp/calq-top.txt | head -10
  sleep 10
done
