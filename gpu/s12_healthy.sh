#!/usr/bin/env bash
# Issue 12, session 12: the 10-minute healthy serving run under the daemon
# (gpu/healthy_serving.sh), started in the background so that it outlives one device call:
#   bash gpu/s12_healthy.sh start SECONDS   (results under /tmp/wp-s12-healthy)
#   bash gpu/s12_healthy.sh collect OUT     (waits for the end, copies the results to OUT)
set -u
H=/tmp/wp-s12-healthy
case ${1:?start|collect} in
start)
  install -d -m 755 /opt/wp-s12n && install -m 755 "${NEW:-$PWD/.bench/s12/names}"/* /opt/wp-s12n/
  rm -rf $H; mkdir -p $H
  NEW=/opt/wp-s12n setsid nohup bash gpu/healthy_serving.sh $H/run "${2:-600}" > $H/summary.log 2>&1 < /dev/null &
  echo "started $(date +%T)";;
collect)
  OUT=${2:?out dir}
  for _ in $(seq 1 110); do grep -q "^healthy loop:" $H/summary.log 2>/dev/null && break; sleep 1; done
  cp -r $H "$OUT/"; cat $H/summary.log | cut -c1-400;;
esac
