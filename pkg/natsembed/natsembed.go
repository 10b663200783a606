// Package natsembed runs an in-process NATS server with JetStream, for `mantle dev`, the
// drills and tests. It is lab gear: a serving process connects to a real NATS
// (events.nats_url), and the `nolab` build of mantle does not link this package or the
// NATS server at all.
package natsembed

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an in-process NATS server whose JetStream data lives in a temporary directory
// removed at shutdown: nothing it holds survives the process.
type Server struct {
	srv *server.Server
	dir string
}

// Start starts NATS with JetStream on 127.0.0.1 at a free port, storing JetStream data in
// a fresh temporary directory.
func Start() (*Server, error) {
	dir, err := os.MkdirTemp("", "mantle-nats-")
	if err != nil {
		return nil, fmt.Errorf("embedded nats store: %w", err)
	}
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoSigs:    true,
		NoLog:     true,
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		os.RemoveAll(dir)
		return nil, errors.New("embedded nats did not become ready within 10s")
	}
	return &Server{srv: srv, dir: dir}, nil
}

// URL is the client URL of the server.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server and removes its data.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	os.RemoveAll(s.dir)
}

// Launch starts a Server and returns its URL and its Shutdown, the shape mesh.Options takes.
func Launch() (url string, shutdown func(), err error) {
	s, err := Start()
	if err != nil {
		return "", nil, err
	}
	return s.URL(), s.Shutdown, nil
}
