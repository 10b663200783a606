package router

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router/internal/idempotency"
)

// idempotencyStore is what the router needs from idempotency records (memory in
// development, NATS JetStream KV across replicas).
type idempotencyStore interface {
	Begin(ctx context.Context, key string) (*idempotency.Record, bool, error)
	Complete(ctx context.Context, key string, rec idempotency.Record) error
	Abandon(ctx context.Context, key string) error
}

// idempotencyKey scopes the caller's key (an Idempotency-Key, or a request id the caller
// chose) by tenant. Without either there is nothing a retry could repeat.
func idempotencyKey(tenant, clientKey, clientRequestID string) string {
	k := clientKey
	if k == "" {
		k = clientRequestID
	}
	if k == "" {
		return ""
	}
	return tenant + "/" + k
}

// once runs the request at most once per idempotency key: a replay gets the recorded
// answer (or error), and a duplicate that arrives while the first is running waits for it.
// Failures that a retry may fix are not recorded, so the retry runs.
func (r *Router) once(ctx context.Context, req *routerv1.Request, rt *route, qc *mantlev1.QualityContext, sink Sink, key string) (*routerv1.CompleteResponse, error) {
	store := r.deps.Idempotency
	if store == nil || key == "" {
		return r.serve(ctx, req, rt, qc, sink)
	}
	began := r.deps.Clock.Now()
	fp := requestFingerprint(req)
	rec, owner, err := store.Begin(ctx, key)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err() // a duplicate gave up waiting for the first
		}
		// The store (NATS) is unreachable, or this tenant's records fill its share of the
		// memory store: answering without replay protection beats not answering; the
		// metric and the audit trail say so.
		if errors.Is(err, idempotency.ErrTenantFull) {
			r.deps.Log.DebugContext(ctx, "idempotency records of this tenant at their limit; serving without replay protection")
		} else {
			r.deps.Log.WarnContext(ctx, "idempotency store unavailable; serving without replay protection", "err", err)
		}
		r.deps.Metrics.idempotencyUnavailable.Inc()
		qc.SkippedSteps = append(qc.SkippedSteps, "idempotency")
		return r.serve(ctx, req, rt, qc, sink)
	}
	if !owner {
		// A duplicate that arrived while the first request ran waited for its record.
		addWait(qc, min(rec.At.Sub(began), r.deps.Clock.Since(began)))
		if len(rec.Fingerprint) > 0 && !bytes.Equal(rec.Fingerprint, fp) {
			return nil, rpc.Status(codes.FailedPrecondition, errorDomain, ReasonIdempotencyKeyReused,
				"this idempotency key was used for a different request body; use a new key for a new request")
		}
		return r.replay(rec, qc, sink)
	}
	resp, err := r.serve(ctx, req, rt, qc, sink)
	// The record is written even when the caller has gone: the work is done and billed.
	wctx := context.WithoutCancel(ctx)
	switch {
	case err == nil:
		data, merr := proto.Marshal(resp)
		if merr == nil {
			merr = store.Complete(wctx, key, idempotency.Record{Response: data, Fingerprint: fp, At: r.deps.Clock.Now()})
		}
		if merr != nil {
			r.deps.Log.WarnContext(ctx, "idempotency record not written", "err", merr)
		}
	case terminal(err):
		st := grpcstatus.Convert(toStatus(err)).Proto()
		data, merr := proto.Marshal(st)
		if merr == nil {
			merr = store.Complete(wctx, key, idempotency.Record{Status: data, Fingerprint: fp, At: r.deps.Clock.Now()})
		}
		if merr != nil {
			r.deps.Log.WarnContext(ctx, "idempotency record not written", "err", merr)
		}
	default:
		if aerr := store.Abandon(wctx, key); aerr != nil {
			r.deps.Log.WarnContext(ctx, "idempotency claim not released", "err", aerr)
		}
	}
	return resp, err
}

// ReasonIdempotencyKeyReused is the ErrorInfo reason of a request whose idempotency key
// already answered a request with another body (HTTP 422).
const ReasonIdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED"

// requestFingerprint identifies req's body for its idempotency record: a hash of the
// request without the fields that travel in headers and do not change what is asked (the
// key itself, the priority).
func requestFingerprint(req *routerv1.Request) []byte {
	c := proto.CloneOf(req)
	c.IdempotencyKey, c.Priority = "", mantlev1.Priority_PRIORITY_UNSPECIFIED
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return nil // not reachable for a validated request; no fingerprint replays as before
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// terminal errors would come out the same on a retry: record them.
func terminal(err error) bool {
	var rejected *rejectedError
	return errors.As(err, &rejected)
}

// replay answers from a record. The QualityContext is the original one with a note, so the
// caller sees which request actually did the work.
func (r *Router) replay(rec *idempotency.Record, qc *mantlev1.QualityContext, sink Sink) (*routerv1.CompleteResponse, error) {
	r.deps.Metrics.replays.Inc()
	if rec.Status != nil {
		var st status.Status
		if err := proto.Unmarshal(rec.Status, &st); err != nil {
			return nil, fmt.Errorf("idempotency record: %w", err)
		}
		return nil, grpcstatus.ErrorProto(&st)
	}
	var resp routerv1.CompleteResponse
	if err := proto.Unmarshal(rec.Response, &resp); err != nil {
		return nil, fmt.Errorf("idempotency record: %w", err)
	}
	if resp.Quality == nil {
		return nil, grpcstatus.Error(codes.Internal, "idempotency record without quality context")
	}
	resp.Quality.Audit = append(resp.Quality.Audit, r.step("replay", "answered from the idempotency record of "+resp.Quality.RequestId+" for "+qc.RequestId, 0))
	return &resp, sendWhole(sink, &resp)
}
