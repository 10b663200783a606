package qdranttest

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/mantle-mesh/mantle/pkg/textsim"
	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Version is what HealthCheck reports: the server line the cache targets.
const Version = "1.17.1"

// FieldIndex is a payload index as created.
type FieldIndex struct {
	Type     qdrant.FieldType
	IsTenant bool
}

// Server is a running in-process Qdrant.
type Server struct {
	// Addr is host:port of the gRPC listener.
	Addr string
	srv  *grpc.Server
	done chan struct{}

	mu          sync.Mutex
	collections map[string]*collection
	fault       func(ctx context.Context, method string) error
	calls       map[string]int
	apiKey      string
	clientCert  *x509.Certificate // presented on the last call's connection (TLS)
	conns       map[net.Conn]bool // open connections, for DropConnections
}

type collection struct {
	dense   bool
	size    uint64
	sparse  map[string]bool
	indexes map[string]FieldIndex
	points  map[string]*point
}

type point struct {
	id      *qdrant.PointId
	payload map[string]*qdrant.Value
	dense   []float32
	sparse  map[string]*qdrant.SparseVector
}

// Start serves a new, empty Qdrant on 127.0.0.1:0 until Close.
func Start() (*Server, error) { return serve(nil) }

// StartTLS is Start over TLS with cfg: with cfg.ClientAuth set to
// tls.RequireAndVerifyClientCert, a client without a certificate of cfg.ClientCAs is
// refused in the handshake, as a Qdrant behind a proxy that requires client certificates
// refuses it.
func StartTLS(cfg *tls.Config) (*Server, error) { return serve(cfg) }

func serve(tlsCfg *tls.Config) (*Server, error) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: raw.Addr().String(), done: make(chan struct{}), collections: map[string]*collection{}, calls: map[string]int{}, conns: map[net.Conn]bool{}}
	lis := &trackingListener{Listener: raw, s: s}
	opts := []grpc.ServerOption{grpc.UnaryInterceptor(s.intercept)}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.srv = grpc.NewServer(opts...)
	qdrant.RegisterCollectionsServer(s.srv, collectionsServer{s: s})
	qdrant.RegisterPointsServer(s.srv, pointsServer{s: s})
	qdrant.RegisterQdrantServer(s.srv, healthServer{})
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(lis) // returns when Close stops the server
	}()
	return s, nil
}

// Close stops the server and waits for it.
func (s *Server) Close() {
	s.srv.Stop()
	<-s.done
}

// DropConnections closes every open client connection, as a restarting Qdrant or a load
// balancer does; clients connect again, with a new handshake, on their next call.
func (s *Server) DropConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Close()
		delete(s.conns, c)
	}
}

// ClientCertificate returns the certificate the client presented on the connection of the
// last call; nil without TLS or without one.
func (s *Server) ClientCertificate() *x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientCert
}

// trackingListener remembers the connections it accepts, for DropConnections.
type trackingListener struct {
	net.Listener
	s *Server
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.mu.Lock()
	l.s.conns[c] = true
	l.s.mu.Unlock()
	return &trackedConn{Conn: c, s: l.s}, nil
}

// trackedConn forgets itself when closed.
type trackedConn struct {
	net.Conn
	s *Server
}

func (c *trackedConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.conns, c.Conn)
	c.s.mu.Unlock()
	return c.Conn.Close()
}

// SetFault installs f, called before every RPC with its full method name; a non-nil error
// is returned to the client instead of running the RPC. f may block (until ctx is done) to
// play a slow server. nil removes it.
func (s *Server) SetFault(f func(ctx context.Context, method string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
}

// Calls returns how many times the RPC with this short name (Query, Upsert, ...) ran.
func (s *Server) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

// FieldIndexes returns the payload indexes of a collection.
func (s *Server) FieldIndexes(name string) map[string]FieldIndex {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.collections[name]
	if c == nil {
		return nil
	}
	out := make(map[string]FieldIndex, len(c.indexes))
	for k, v := range c.indexes {
		out[k] = v
	}
	return out
}

// Collections returns the collection names, sorted.
func (s *Server) Collections() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name := range s.collections {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Payloads returns the payloads of a collection's points.
func (s *Server) Payloads(name string) []map[string]*qdrant.Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.collections[name]
	if c == nil {
		return nil
	}
	var out []map[string]*qdrant.Value
	for _, p := range c.points {
		out = append(out, p.payload)
	}
	return out
}

// APIKey returns the api-key header of the last call.
func (s *Server) APIKey() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apiKey
}

func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	s.mu.Lock()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if keys := md.Get("api-key"); len(keys) > 0 {
			s.apiKey = keys[0]
		}
	}
	s.clientCert = nil
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
			s.clientCert = info.State.PeerCertificates[0]
		}
	}
	f := s.fault
	s.calls[lastSegment(info.FullMethod)]++
	s.mu.Unlock()
	if f != nil {
		if err := f(ctx, info.FullMethod); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

func lastSegment(method string) string {
	for i := len(method) - 1; i >= 0; i-- {
		if method[i] == '/' {
			return method[i+1:]
		}
	}
	return method
}

// get returns the named collection; s.mu must be held.
func (s *Server) get(name string) (*collection, error) {
	c := s.collections[name]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "Not found: Collection `%s` doesn't exist!", name)
	}
	return c, nil
}

type healthServer struct {
	qdrant.UnimplementedQdrantServer
}

func (healthServer) HealthCheck(context.Context, *qdrant.HealthCheckRequest) (*qdrant.HealthCheckReply, error) {
	return &qdrant.HealthCheckReply{Title: "qdranttest", Version: Version}, nil
}

type collectionsServer struct {
	qdrant.UnimplementedCollectionsServer
	s *Server
}

func (cs collectionsServer) Create(_ context.Context, req *qdrant.CreateCollection) (*qdrant.CollectionOperationResponse, error) {
	s := cs.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.collections[req.GetCollectionName()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "Wrong input: Collection `%s` already exists!", req.GetCollectionName())
	}
	c := &collection{sparse: map[string]bool{}, indexes: map[string]FieldIndex{}, points: map[string]*point{}}
	if p := req.GetVectorsConfig().GetParams(); p != nil {
		if p.GetDistance() != qdrant.Distance_Cosine {
			return nil, status.Errorf(codes.Unimplemented, "qdranttest: only cosine distance, got %v", p.GetDistance())
		}
		c.dense, c.size = true, p.GetSize()
	} else if req.GetVectorsConfig() != nil {
		return nil, status.Error(codes.Unimplemented, "qdranttest: only one unnamed dense vector")
	}
	for name := range req.GetSparseVectorsConfig().GetMap() {
		c.sparse[name] = true
	}
	if !c.dense && len(c.sparse) == 0 {
		return nil, status.Error(codes.InvalidArgument, "qdranttest: a collection needs a vector")
	}
	s.collections[req.GetCollectionName()] = c
	return &qdrant.CollectionOperationResponse{Result: true}, nil
}

func (cs collectionsServer) CollectionExists(_ context.Context, req *qdrant.CollectionExistsRequest) (*qdrant.CollectionExistsResponse, error) {
	cs.s.mu.Lock()
	defer cs.s.mu.Unlock()
	_, ok := cs.s.collections[req.GetCollectionName()]
	return &qdrant.CollectionExistsResponse{Result: &qdrant.CollectionExists{Exists: ok}}, nil
}

func (cs collectionsServer) List(context.Context, *qdrant.ListCollectionsRequest) (*qdrant.ListCollectionsResponse, error) {
	var out []*qdrant.CollectionDescription
	for _, name := range cs.s.Collections() {
		out = append(out, &qdrant.CollectionDescription{Name: name})
	}
	return &qdrant.ListCollectionsResponse{Collections: out}, nil
}

func (cs collectionsServer) Delete(_ context.Context, req *qdrant.DeleteCollection) (*qdrant.CollectionOperationResponse, error) {
	cs.s.mu.Lock()
	defer cs.s.mu.Unlock()
	_, ok := cs.s.collections[req.GetCollectionName()]
	delete(cs.s.collections, req.GetCollectionName())
	return &qdrant.CollectionOperationResponse{Result: ok}, nil
}

type pointsServer struct {
	qdrant.UnimplementedPointsServer
	s *Server
}

func completed() *qdrant.PointsOperationResponse {
	return &qdrant.PointsOperationResponse{Result: &qdrant.UpdateResult{Status: qdrant.UpdateStatus_Completed}}
}

func (ps pointsServer) CreateFieldIndex(_ context.Context, req *qdrant.CreateFieldIndexCollection) (*qdrant.PointsOperationResponse, error) {
	s := ps.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.get(req.GetCollectionName())
	if err != nil {
		return nil, err
	}
	ix := FieldIndex{Type: req.GetFieldType()}
	if kw := req.GetFieldIndexParams().GetKeywordIndexParams(); kw != nil {
		ix.IsTenant = kw.GetIsTenant()
	}
	c.indexes[req.GetFieldName()] = ix
	return completed(), nil
}

func idString(id *qdrant.PointId) string {
	if u := id.GetUuid(); u != "" {
		return "u:" + u
	}
	return fmt.Sprintf("n:%d", id.GetNum())
}

func (ps pointsServer) Upsert(_ context.Context, req *qdrant.UpsertPoints) (*qdrant.PointsOperationResponse, error) {
	s := ps.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.get(req.GetCollectionName())
	if err != nil {
		return nil, err
	}
	for _, p := range req.GetPoints() {
		stored := &point{id: p.GetId(), payload: p.GetPayload(), sparse: map[string]*qdrant.SparseVector{}}
		vs := p.GetVectors()
		if v := vs.GetVector(); v != nil {
			d := denseOf(v)
			if !c.dense || uint64(len(d)) != c.size {
				return nil, status.Errorf(codes.InvalidArgument, "Wrong input: Vector dimension error: expected dim: %d, got %d", c.size, len(d))
			}
			stored.dense = d
		}
		for name, v := range vs.GetVectors().GetVectors() {
			sp := v.GetSparse()
			if !c.sparse[name] || sp == nil {
				return nil, status.Errorf(codes.InvalidArgument, "Wrong input: Not existing vector name error: %s", name)
			}
			stored.sparse[name] = sp
		}
		if c.dense && stored.dense == nil {
			return nil, status.Error(codes.InvalidArgument, "Wrong input: the point has no dense vector")
		}
		c.points[idString(p.GetId())] = stored
	}
	return completed(), nil
}

// denseOf reads a dense vector in either of the protocol's spellings.
func denseOf(v *qdrant.Vector) []float32 {
	if d := v.GetDense(); d != nil {
		return d.GetData()
	}
	return v.GetData() //nolint:staticcheck // the deprecated field is what older clients send
}

func (ps pointsServer) Get(_ context.Context, req *qdrant.GetPoints) (*qdrant.GetResponse, error) {
	s := ps.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.get(req.GetCollectionName())
	if err != nil {
		return nil, err
	}
	var out []*qdrant.RetrievedPoint
	for _, id := range req.GetIds() {
		if p, ok := c.points[idString(id)]; ok {
			out = append(out, &qdrant.RetrievedPoint{Id: p.id, Payload: withPayload(req.GetWithPayload(), p.payload)})
		}
	}
	return &qdrant.GetResponse{Result: out}, nil
}

func withPayload(sel *qdrant.WithPayloadSelector, payload map[string]*qdrant.Value) map[string]*qdrant.Value {
	if sel.GetEnable() {
		return payload
	}
	return nil
}

func (ps pointsServer) Query(_ context.Context, req *qdrant.QueryPoints) (*qdrant.QueryResponse, error) {
	s := ps.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.get(req.GetCollectionName())
	if err != nil {
		return nil, err
	}
	if len(req.GetPrefetch()) > 0 || req.GetOffset() != 0 {
		return nil, status.Error(codes.Unimplemented, "qdranttest: prefetch and offset")
	}
	nearest := req.GetQuery().GetNearest()
	if nearest == nil {
		return nil, status.Error(codes.Unimplemented, "qdranttest: only nearest queries")
	}
	var score func(p *point) (float32, bool)
	switch {
	case nearest.GetDense() != nil:
		if !c.dense || req.GetUsing() != "" {
			return nil, status.Error(codes.InvalidArgument, "Wrong input: the collection has no unnamed dense vector")
		}
		q := nearest.GetDense().GetData()
		if uint64(len(q)) != c.size {
			return nil, status.Errorf(codes.InvalidArgument, "Wrong input: Vector dimension error: expected dim: %d, got %d", c.size, len(q))
		}
		score = func(p *point) (float32, bool) { return float32(textsim.Cosine(q, p.dense)), true }
	case nearest.GetSparse() != nil:
		name := req.GetUsing()
		if !c.sparse[name] {
			return nil, status.Errorf(codes.InvalidArgument, "Wrong input: Not existing vector name error: %s", name)
		}
		q := nearest.GetSparse()
		score = func(p *point) (float32, bool) {
			sp, ok := p.sparse[name]
			if !ok {
				return 0, false
			}
			return sparseDot(q, sp), true
		}
	default:
		return nil, status.Error(codes.Unimplemented, "qdranttest: only dense and sparse vector inputs")
	}
	var hits []*qdrant.ScoredPoint
	for _, p := range c.points {
		ok, err := matches(req.GetFilter(), p)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		sc, ok := score(p)
		if !ok || (req.ScoreThreshold != nil && sc < req.GetScoreThreshold()) {
			continue
		}
		hits = append(hits, &qdrant.ScoredPoint{Id: p.id, Score: sc, Payload: withPayload(req.GetWithPayload(), p.payload)})
	}
	slices.SortFunc(hits, func(a, b *qdrant.ScoredPoint) int {
		if a.Score != b.Score {
			return cmp.Compare(b.Score, a.Score)
		}
		return cmp.Compare(idString(a.Id), idString(b.Id))
	})
	limit := uint64(10)
	if req.Limit != nil {
		limit = req.GetLimit()
	}
	if uint64(len(hits)) > limit {
		hits = hits[:limit]
	}
	return &qdrant.QueryResponse{Result: hits}, nil
}

func sparseDot(a, b *qdrant.SparseVector) float32 {
	weights := make(map[uint32]float32, len(b.GetIndices()))
	for i, ix := range b.GetIndices() {
		weights[ix] = b.GetValues()[i]
	}
	var sum float32
	for i, ix := range a.GetIndices() {
		sum += a.GetValues()[i] * weights[ix]
	}
	return sum
}

func (ps pointsServer) Count(_ context.Context, req *qdrant.CountPoints) (*qdrant.CountResponse, error) {
	s := ps.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.get(req.GetCollectionName())
	if err != nil {
		return nil, err
	}
	n := uint64(0)
	for _, p := range c.points {
		ok, err := matches(req.GetFilter(), p)
		if err != nil {
			return nil, err
		}
		if ok {
			n++
		}
	}
	return &qdrant.CountResponse{Result: &qdrant.CountResult{Count: n}}, nil
}

func (ps pointsServer) Delete(_ context.Context, req *qdrant.DeletePoints) (*qdrant.PointsOperationResponse, error) {
	s := ps.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.get(req.GetCollectionName())
	if err != nil {
		return nil, err
	}
	sel := req.GetPoints()
	switch {
	case sel.GetPoints() != nil:
		for _, id := range sel.GetPoints().GetIds() {
			delete(c.points, idString(id))
		}
	case sel.GetFilter() != nil:
		for id, p := range c.points {
			ok, err := matches(sel.GetFilter(), p)
			if err != nil {
				return nil, err
			}
			if ok {
				delete(c.points, id)
			}
		}
	default:
		return nil, status.Error(codes.InvalidArgument, "Wrong input: no points selector")
	}
	return completed(), nil
}

// matches evaluates a filter on a point's payload the way Qdrant does: every must, at
// least one should (when there are any), no must_not.
func matches(f *qdrant.Filter, p *point) (bool, error) {
	if f == nil {
		return true, nil
	}
	if f.MinShould != nil {
		return false, status.Error(codes.Unimplemented, "qdranttest: min_should")
	}
	for _, c := range f.GetMust() {
		ok, err := condition(c, p)
		if err != nil || !ok {
			return false, err
		}
	}
	for _, c := range f.GetMustNot() {
		ok, err := condition(c, p)
		if err != nil || ok {
			return false, err
		}
	}
	if len(f.GetShould()) == 0 {
		return true, nil
	}
	for _, c := range f.GetShould() {
		ok, err := condition(c, p)
		if err != nil {
			return false, err
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

func condition(c *qdrant.Condition, p *point) (bool, error) {
	switch {
	case c.GetField() != nil:
		return fieldCondition(c.GetField(), p.payload[c.GetField().GetKey()])
	case c.GetFilter() != nil:
		return matches(c.GetFilter(), p)
	case c.GetHasId() != nil:
		for _, id := range c.GetHasId().GetHasId() {
			if idString(id) == idString(p.id) {
				return true, nil
			}
		}
		return false, nil
	default:
		return false, status.Errorf(codes.Unimplemented, "qdranttest: condition %T", c.GetConditionOneOf())
	}
}

func fieldCondition(fc *qdrant.FieldCondition, v *qdrant.Value) (bool, error) {
	switch {
	case fc.GetMatch() != nil:
		if v == nil {
			return false, nil
		}
		m := fc.GetMatch()
		switch mv := m.GetMatchValue().(type) {
		case *qdrant.Match_Keyword:
			return anyValue(v, func(x *qdrant.Value) bool {
				s, ok := x.GetKind().(*qdrant.Value_StringValue)
				return ok && s.StringValue == mv.Keyword
			}), nil
		case *qdrant.Match_Integer:
			return anyValue(v, func(x *qdrant.Value) bool {
				i, ok := x.GetKind().(*qdrant.Value_IntegerValue)
				return ok && i.IntegerValue == mv.Integer
			}), nil
		case *qdrant.Match_Boolean:
			return anyValue(v, func(x *qdrant.Value) bool {
				b, ok := x.GetKind().(*qdrant.Value_BoolValue)
				return ok && b.BoolValue == mv.Boolean
			}), nil
		default:
			return false, status.Errorf(codes.Unimplemented, "qdranttest: match %T", mv)
		}
	case fc.GetRange() != nil:
		r := fc.GetRange()
		if v == nil {
			return false, nil
		}
		return anyValue(v, func(x *qdrant.Value) bool {
			var f float64
			switch k := x.GetKind().(type) {
			case *qdrant.Value_IntegerValue:
				f = float64(k.IntegerValue)
			case *qdrant.Value_DoubleValue:
				f = k.DoubleValue
			default:
				return false
			}
			return (r.Lt == nil || f < r.GetLt()) && (r.Lte == nil || f <= r.GetLte()) &&
				(r.Gt == nil || f > r.GetGt()) && (r.Gte == nil || f >= r.GetGte())
		}), nil
	default:
		return false, status.Errorf(codes.Unimplemented, "qdranttest: field condition on %s", fc.GetKey())
	}
}

// anyValue applies ok to v, or to each element when v is a list (Qdrant matches a list
// payload when any element matches).
func anyValue(v *qdrant.Value, ok func(*qdrant.Value) bool) bool {
	if l := v.GetListValue(); l != nil {
		return slices.ContainsFunc(l.GetValues(), ok)
	}
	return ok(v)
}
