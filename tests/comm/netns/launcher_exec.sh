#!/bin/sh
# hydra's "ssh" for the simulated machines: `launcher_exec.sh [ssh options] HOST COMMAND...`
# runs COMMAND in HOST's network namespace instead of logging in to HOST.
# SBPFLOW_NETNS_HOSTS maps hosts to namespaces: "ADDR=NAMESPACE ADDR=NAMESPACE ...".
while [ $# -gt 0 ]; do
    case "$1" in
        -[bcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;  # ssh options that take a value
        -*) shift ;;
        *) break ;;
    esac
done
if [ $# -lt 2 ]; then
    echo "launcher_exec.sh: usage: launcher_exec.sh [ssh options] HOST COMMAND..." >&2
    exit 2
fi
host="$1"
shift
for pair in $SBPFLOW_NETNS_HOSTS; do
    if [ "${pair%%=*}" = "$host" ]; then
        exec ip netns exec "${pair#*=}" sh -c "$*"
    fi
done
echo "launcher_exec.sh: host $host is none of the simulated machines ($SBPFLOW_NETNS_HOSTS)" >&2
exit 255
