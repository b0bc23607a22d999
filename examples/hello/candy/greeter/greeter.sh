#!/bin/sh
# Serves one line of text on :8080.
mkdir -p /tmp/greeter
echo "${HELLO_GREETING:-hello}" > /tmp/greeter/index.html
exec busybox httpd -f -p 8080 -h /tmp/greeter
