#!/bin/bash
# reward 1 when the count is right, else 0
mkdir -p /logs/verifier
if [ "$(cat /app/count.txt 2>/dev/null)" = "9" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
