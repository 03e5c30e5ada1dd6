#!/usr/bin/env bash
# Runs phc2sys to copy the NIC's PTP hardware clock (kept on the grandmaster's time by
# ptp4l, see ptp4l.conf) to the system clock (CLOCK_REALTIME) that hoptrace's probes read.
#
#   phc2sys.sh IFACE [--dry-run]     e.g. phc2sys.sh eth0
#
# The command it runs (print it with --dry-run):
#
#   phc2sys -s IFACE -c CLOCK_REALTIME -w -R 8 -n DOMAIN -z UDS -m -q
#
#   -s IFACE            master clock: the PHC of the interface ptp4l runs on
#   -c CLOCK_REALTIME   slave clock: the system clock
#   -w                  wait until ptp4l is synchronised, and take the TAI-UTC offset from
#                       it (the PHC runs on TAI, the system clock on UTC)
#   -R 8                update 8 times a second
#   -n DOMAIN -z UDS    ptp4l's domainNumber and management socket
#                       (HOPTRACE_PTP_DOMAIN, default 0; HOPTRACE_PTP_UDS, default
#                       /var/run/ptp4l)
#   -m -q               log to stdout, not syslog: "CLOCK_REALTIME phc offset -24 s2 freq
#                       +1234 delay 567" once a second; the offset is the system clock's
#                       error against the PHC, on top of the PHC's against the grandmaster
#
# Alternatively `phc2sys -a -r` finds the slave port from ptp4l by itself. Run it as a service
# (Debian ships phc2sys@.service) rather than with this script on production hosts.
set -euo pipefail

IFACE=${1:-}
[[ -n $IFACE && $IFACE != -* ]] || {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}
PHC2SYS=${PHC2SYS:-$(command -v phc2sys || echo /usr/sbin/phc2sys)}
cmd=("$PHC2SYS" -s "$IFACE" -c CLOCK_REALTIME -w -R 8
    -n "${HOPTRACE_PTP_DOMAIN:-0}" -z "${HOPTRACE_PTP_UDS:-/var/run/ptp4l}" -m -q)

if [[ ${2:-} == --dry-run ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
[[ -x $PHC2SYS ]] || { echo "phc2sys.sh: phc2sys not found (apt-get install linuxptp)" >&2; exit 1; }
exec "${cmd[@]}"
