package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
	"github.com/mantle-mesh/mantle/services/router"
)

func chat(ctx context.Context, args []string, env cmdEnv) error {
	stdout, stderr := env.stdout, env.stderr
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", env.varOr("MANTLE_ADDR", "127.0.0.1:9090"), "router gRPC address ($MANTLE_ADDR)")
	key := fs.String("key", env.varOr("MANTLE_API_KEY", devKey), "tenant API key ($MANTLE_API_KEY)")
	model := fs.String("model", "chat", "model or route")
	system := fs.String("system", "", "system prompt")
	stream := fs.Bool("stream", false, "stream the answer")
	jsonOut := fs.Bool("json", false, "ask for a JSON object answer")
	timeout := fs.Duration("timeout", 30*time.Second, "deadline for the whole request")
	var tlsFlags clientTLS
	tlsFlags.register(fs, env)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	question := strings.Join(fs.Args(), " ")
	if question == "" {
		return errors.New(`usage: mantle chat [flags] "question"`)
	}
	creds, err := tlsFlags.credentials()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	defer conn.Close()
	client := routerv1.NewRouterServiceClient(conn)

	req := &routerv1.Request{Model: *model}
	if *system != "" {
		req.Messages = append(req.Messages, &mantlev1.ChatMessage{Role: "system", Content: *system})
	}
	req.Messages = append(req.Messages, &mantlev1.ChatMessage{Role: "user", Content: question})
	if *jsonOut {
		req.ResponseFormat = &mantlev1.ResponseFormat{Type: mantlev1.ResponseFormat_TYPE_JSON_OBJECT}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+*key)
	start := time.Now()

	var final *routerv1.CompleteResponse
	if *stream {
		s, err := client.StreamComplete(ctx, &routerv1.StreamCompleteRequest{Request: req})
		if err != nil {
			return describe(err)
		}
		for {
			msg, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return describe(err)
			}
			if d := msg.GetDelta(); d != nil {
				fmt.Fprint(stdout, d.Content)
			}
			if f := msg.GetFinal(); f != nil {
				final = f
			}
		}
		fmt.Fprintln(stdout)
	} else {
		final, err = client.Complete(ctx, &routerv1.CompleteRequest{Request: req})
		if err != nil {
			return describe(err)
		}
		fmt.Fprintln(stdout, final.GetMessage().GetContent())
	}
	if final != nil {
		fmt.Fprintln(stdout, summary(final, time.Since(start)))
	}
	return nil
}

// summary is the one-line view of a QualityContext.
func summary(resp *routerv1.CompleteResponse, elapsed time.Duration) string {
	qc := resp.GetQuality()
	cache := "miss"
	switch {
	case qc.GetCacheHit() && qc.GetCacheStale():
		cache = fmt.Sprintf("stale(%.2f)", qc.GetCacheSimilarity())
	case qc.GetCacheHit():
		cache = fmt.Sprintf("hit(%.2f)", qc.GetCacheSimilarity())
	}
	grade := strings.ToLower(strings.TrimPrefix(qc.GetQualityGrade().String(), "QUALITY_GRADE_"))
	// latency is what this client waited; mantle and upstream are how the router split it
	// (QualityContext overhead and upstream_latency).
	return fmt.Sprintf("-- model=%s level=%s cache=%s quality=%s attempts=%d tokens=%d+%d cost=$%.6f latency=%s mantle=%s upstream=%s request=%s",
		resp.GetModel(), router.ShortLevel(qc.GetFallbackLevel()), cache, grade, len(qc.GetAttempts()),
		qc.GetUsage().GetInputTokens(), qc.GetUsage().GetOutputTokens(), qc.GetCostUsd(),
		elapsed.Round(time.Millisecond), qc.GetOverhead().AsDuration().Round(time.Microsecond),
		qc.GetUpstreamLatency().AsDuration().Round(time.Millisecond), qc.GetRequestId())
}

func describe(err error) error {
	st := status.Convert(err)
	msg := fmt.Sprintf("%s: %s", st.Code(), st.Message())
	if info := rpc.ErrorInfo(err); info != nil {
		msg += " [" + info.Reason + "]"
	}
	if d, ok := rpc.RetryDelay(err); ok {
		msg += fmt.Sprintf(" (retry after %s)", d)
	}
	return errors.New(msg)
}
