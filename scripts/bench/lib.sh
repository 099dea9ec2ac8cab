# Sourced by scripts/bench.sh and scripts/instructions.sh: what both need to measure a proxy.

# install_missing: scripts/install.sh.
. "$(dirname "${BASH_SOURCE[0]}")/../install.sh"

# port: a free TCP port on 127.0.0.1.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_upstream DIR PORT: an nginx of its own (one worker) on 127.0.0.1:PORT answering `ok` on / and a
# 20-event text/event-stream on /sse, with its files in DIR (pid in DIR/upstream.pid). DIR must be
# readable by nginx's workers.
start_upstream() {
  local dir=$1 port=$2
  for _ in $(seq 20); do printf 'data: {"token": "hello"}\n\n'; done >"$dir/sse.txt"
  cat >"$dir/upstream.conf" <<NGINX
worker_processes 1;
pid $dir/upstream.pid;
error_log $dir/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$port;
    location / { return 200 "ok\n"; }
    location /sse { default_type text/event-stream; alias $dir/sse.txt; }
  }
}
NGINX
  nginx -c "$dir/upstream.conf" -p "$dir" -e "$dir/nginx-error.log"
}

# write_nginx_proxy DIR PORT UPSTREAM_PORT [DIRECTIVE]...: DIR/proxy.conf, nginx as the proxy the bench
# compares with: `limit_conn` on the key header, in front of 127.0.0.1:UPSTREAM_PORT over kept-alive
# connections, unbuffered, listening on 127.0.0.1:PORT. The DIRECTIVEs open the file (default: one worker
# per core, Debian's default).
write_nginx_proxy() {
  local dir=$1 port=$2 up=$3
  shift 3
  [ $# -gt 0 ] || set -- "worker_processes auto;"
  { printf '%s\n' "$@"
    cat <<NGINX
pid $dir/proxy.pid;
error_log $dir/nginx-proxy-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  limit_conn_zone \$http_x_inflight_key zone=keys:10m;
  upstream api { server 127.0.0.1:$up; keepalive 128; }
  server {
    listen 127.0.0.1:$port;
    location / {
      limit_conn keys 60000;
      proxy_pass http://api;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX
  } >"$dir/proxy.conf"
}
