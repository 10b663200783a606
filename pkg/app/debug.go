package app

import (
	"expvar"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// debugProfileLimit bounds a CPU profile or trace request (?seconds=): net/http/pprof
// refuses durations at or past the server's write timeout.
const debugProfileLimit = 2 * time.Minute

// debugListenAddress makes an address without a host ("6060" or ":6060") a loopback one:
// profiles show prompts in memory and cost CPU, so exposing them beyond the machine must be
// asked for with an explicit host.
func debugListenAddress(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil { // a bare port
		return net.JoinHostPort("127.0.0.1", addr)
	}
	if host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// newDebugServer serves net/http/pprof under /debug/pprof/ and expvar (memstats, cmdline)
// under /debug/vars, and the process's metrics under /metrics when metrics is not nil. With
// authentication on, every request needs an operator key: profiles show what is in memory
// (prompts, answers), and the operator plane is where such things are.
func newDebugServer(metrics http.Handler, authn *rpc.Authenticator) *http.Server {
	mux := http.NewServeMux()
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("GET /debug/vars", expvar.Handler())
	return &http.Server{Handler: operatorsOnly(mux, authn), ReadHeaderTimeout: 10 * time.Second, WriteTimeout: debugProfileLimit + 10*time.Second}
}

// operatorsOnly lets through requests that carry an operator key (Authorization: Bearer),
// and every request when authentication is off. A refusal is logged and counted like the
// other doors' (mantle_auth_refusals_total): 401 without a valid key, 403 for a tenant key.
func operatorsOnly(next http.Handler, authn *rpc.Authenticator) http.Handler {
	if !authn.Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := authn.LoginOperatorHTTP(r.Context(), r.Header.Get("Authorization"), "debug "+r.URL.Path)
		switch status.Code(err) {
		case codes.OK:
			next.ServeHTTP(w, r)
		case codes.PermissionDenied:
			http.Error(w, "forbidden: the debug listener is for operator keys", http.StatusForbidden)
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="mantle debug"`)
			http.Error(w, "unauthorized: send Authorization: Bearer <operator key>", http.StatusUnauthorized)
		}
	})
}

// DebugAddr is the bound debug address, or "" when the debug listener is off.
func (a *App) DebugAddr() string {
	if a.debugLis == nil {
		return ""
	}
	return a.debugLis.Addr().String()
}
