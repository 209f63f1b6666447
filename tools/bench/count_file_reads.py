#!/usr/bin/env python3
"""Counts the read system calls made on one file in strace logs (issue 59, tools/bench/load_reads.sh).

    count_file_reads.py FILE LOG...     (strace -f -e trace=openat,open,close,read,pread64,readv,preadv,preadv2)

Prints, per log, "LOG opens=N reads=N bytes=N": opens of FILE, and the read calls on the descriptors those opens
returned (read, pread64, readv, preadv, preadv2; a call split by strace into "unfinished" and "resumed" counts
once), with the bytes they returned. Descriptors are tracked per log, i.e. per process (its threads share them).
"""
import os
import re
import sys

OPEN = re.compile(r'^(?:\[pid\s+)?\d*\]?\s*(?:openat\(\w+, |open\()"([^"]*)".*\)\s+=\s+(\d+)')
CLOSE = re.compile(r'^(?:\[pid\s+)?\d*\]?\s*close\((\d+)\)')
READ = re.compile(r'^(?:\[pid\s+)?\d*\]?\s*(read|pread64|readv|preadv|preadv2)\((\d+),')
RESUMED = re.compile(r'<\.\.\. (read|pread64|readv|preadv|preadv2) resumed>.*=\s+(-?\d+)')
RESULT = re.compile(r'=\s+(-?\d+)(?:\s|$)')


def count(target, log):
    target = os.path.realpath(target)
    fds, opens, reads, nbytes = set(), 0, 0, 0
    pending = {}  # pid -> whether its unfinished read is on the file
    with open(log, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            pid = line.split(None, 1)[0] if line[:1].isdigit() else ""
            m = OPEN.match(line)
            if m and os.path.realpath(m.group(1)) == target:
                opens += 1
                fds.add(int(m.group(2)))
                continue
            m = CLOSE.match(line)
            if m and "<unfinished" not in line:
                fds.discard(int(m.group(1)))
                continue
            m = READ.match(line)
            if m:
                on_file = int(m.group(2)) in fds
                if "<unfinished" in line:
                    pending[pid] = on_file
                    reads += on_file
                    continue
                if on_file:
                    reads += 1
                    r = RESULT.search(line[line.rfind(")"):])
                    nbytes += max(0, int(r.group(1))) if r else 0
                continue
            m = RESUMED.search(line)
            if m and pending.pop(pid, False):
                nbytes += max(0, int(m.group(2)))
    return opens, reads, nbytes


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for log in sys.argv[2:]:
        opens, reads, nbytes = count(sys.argv[1], log)
        print(f"{log} opens={opens} reads={reads} bytes={nbytes}")


if __name__ == "__main__":
    main()
