package qdranttest

import (
	"context"
	"net"
	"slices"
	"strconv"
	"testing"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func start(t *testing.T) (*Server, *qdrant.Client) {
	t.Helper()
	srv, err := Start()
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(srv.Close)
	host, port, err := net.SplitHostPort(srv.Addr)
	if err != nil {
		t.Fatalf("address %q: %v", srv.Addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("port %q: %v", port, err)
	}
	client, err := qdrant.NewClient(&qdrant.Config{Host: host, Port: p, SkipCompatibilityCheck: true, PoolSize: 1})
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return srv, client
}

func TestFiltersAndScores(t *testing.T) {
	t.Parallel()
	_, client := start(t)
	ctx := context.Background()
	if err := client.CreateCollection(ctx, &qdrant.CreateCollection{
		CollectionName: "c",
		VectorsConfig:  qdrant.NewVectorsConfig(&qdrant.VectorParams{Size: 2, Distance: qdrant.Distance_Cosine}),
	}); err != nil {
		t.Fatalf("CreateCollection: %v", err)
	}
	points := []*qdrant.PointStruct{
		{Id: qdrant.NewIDNum(1), Vectors: qdrant.NewVectorsDense([]float32{1, 0}), Payload: qdrant.NewValueMap(map[string]any{"t": "a", "n": 1})},
		{Id: qdrant.NewIDNum(2), Vectors: qdrant.NewVectorsDense([]float32{1, 1}), Payload: qdrant.NewValueMap(map[string]any{"t": "a", "n": 5})},
		{Id: qdrant.NewIDNum(3), Vectors: qdrant.NewVectorsDense([]float32{0, 1}), Payload: qdrant.NewValueMap(map[string]any{"t": "b", "n": 9})},
	}
	if _, err := client.Upsert(ctx, &qdrant.UpsertPoints{CollectionName: "c", Points: points}); err != nil {
		t.Fatalf("Upsert: %v", err)
	}
	query := func(f *qdrant.Filter, threshold *float32) []uint64 {
		t.Helper()
		res, err := client.Query(ctx, &qdrant.QueryPoints{CollectionName: "c", Query: qdrant.NewQueryDense([]float32{1, 0}), Filter: f, ScoreThreshold: threshold})
		if err != nil {
			t.Fatalf("Query: %v", err)
		}
		var ids []uint64
		for _, p := range res {
			ids = append(ids, p.GetId().GetNum())
		}
		return ids
	}
	tests := []struct {
		name      string
		filter    *qdrant.Filter
		threshold *float32
		want      []uint64
	}{
		{"no filter, by cosine", nil, nil, []uint64{1, 2, 3}},
		{"threshold", nil, new(float32(0.5)), []uint64{1, 2}},
		{"must keyword", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("t", "a")}}, nil, []uint64{1, 2}},
		{"must_not", &qdrant.Filter{MustNot: []*qdrant.Condition{qdrant.NewMatchKeyword("t", "a")}}, nil, []uint64{3}},
		{"should", &qdrant.Filter{Should: []*qdrant.Condition{qdrant.NewMatchInt("n", 9), qdrant.NewMatchInt("n", 1)}}, nil, []uint64{1, 3}},
		{"range", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewRange("n", &qdrant.Range{Gt: new(1.0), Lte: new(9.0)})}}, nil, []uint64{2, 3}},
		{"has id", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewHasID(qdrant.NewIDNum(3))}}, nil, []uint64{3}},
		{"missing field matches nothing", &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("missing", "a")}}, nil, nil},
	}
	for _, tt := range tests {
		if got := query(tt.filter, tt.threshold); !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
	if n, err := client.Count(ctx, &qdrant.CountPoints{CollectionName: "c", Filter: &qdrant.Filter{Must: []*qdrant.Condition{qdrant.NewMatchKeyword("t", "a")}}}); err != nil || n != 2 {
		t.Errorf("Count = (%d, %v), want 2", n, err)
	}
}

func TestErrorsLikeQdrant(t *testing.T) {
	t.Parallel()
	srv, client := start(t)
	ctx := context.Background()
	_, err := client.Query(ctx, &qdrant.QueryPoints{CollectionName: "none", Query: qdrant.NewQueryDense([]float32{1})})
	if status.Code(err) != codes.NotFound {
		t.Errorf("Query of a missing collection: %v, want NotFound", err)
	}
	if err := client.CreateCollection(ctx, &qdrant.CreateCollection{
		CollectionName:      "s",
		SparseVectorsConfig: qdrant.NewSparseVectorsConfig(map[string]*qdrant.SparseVectorParams{"x": {}}),
	}); err != nil {
		t.Fatalf("CreateCollection: %v", err)
	}
	err = client.CreateCollection(ctx, &qdrant.CreateCollection{
		CollectionName:      "s",
		SparseVectorsConfig: qdrant.NewSparseVectorsConfig(map[string]*qdrant.SparseVectorParams{"x": {}}),
	})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("second CreateCollection: %v, want AlreadyExists", err)
	}
	_, err = client.Upsert(ctx, &qdrant.UpsertPoints{CollectionName: "s", Points: []*qdrant.PointStruct{
		{Id: qdrant.NewIDNum(1), Vectors: qdrant.NewVectorsMap(map[string]*qdrant.Vector{"y": qdrant.NewVectorSparse([]uint32{1}, []float32{1})})},
	}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("Upsert to an unknown vector name: %v, want InvalidArgument", err)
	}
	_, err = client.Scroll(ctx, &qdrant.ScrollPoints{CollectionName: "s"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("Scroll: %v, want Unimplemented (not part of the subset)", err)
	}
	if srv.Calls("Upsert") != 1 {
		t.Errorf("Calls(Upsert) = %d, want 1", srv.Calls("Upsert"))
	}
}
