package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
)

const reviewUsage = `usage: mantle review <command> [flags] [review id]

  list     list reviews (--state pending|claimed|decided|timed_out, --scenario); with
           --confirmations, the actions whose outcome a person must confirm (pending
           unless --state happened|not_happened|all; --tenant). mantle review
           --confirmations is short for list --confirmations
  show     show one review
  claim    take a lease on a review; without an id, on the pending review due first
  decide   record your decision on a review you claimed; on a confirmation (cf_...),
           --happened [--result TEXT] or --not-happened (operators only)
  audit    list the audit trail (of one review or confirmation, or of everything; --actor)

Common flags: --addr (verifier gRPC address, $MANTLE_ADDR), --key (an operator key, which
sees every tenant's reviews, from $MANTLE_OPERATOR_KEY; or a tenant key, which sees that
tenant's, from $MANTLE_API_KEY),
--timeout, --json (print the response as JSON). Run mantle review <command> -h for more.`

// review is `mantle review`: the human review workbench on the command line.
func review(ctx context.Context, args []string, env cmdEnv) error {
	stdout, stderr := env.stdout, env.stderr
	if len(args) == 0 {
		fmt.Fprintln(stderr, reviewUsage)
		return errUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, reviewUsage)
		return flag.ErrHelp
	}
	if args[0] == "--confirmations" || args[0] == "-confirmations" {
		args = append([]string{"list", "--confirmations"}, args[1:]...)
	}
	sub, ok := reviewCommands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "mantle review: unknown command %q\n\n%s\n", args[0], reviewUsage)
		return errUsage
	}
	fs := flag.NewFlagSet("review "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &reviewCLI{stdout: stdout, getenv: env.getenv}
	fs.StringVar(&c.addr, "addr", env.varOr("MANTLE_ADDR", "127.0.0.1:9090"), "verifier gRPC address ($MANTLE_ADDR)")
	fs.StringVar(&c.key, "key", env.varOr("MANTLE_OPERATOR_KEY", env.varOr("MANTLE_API_KEY", devOperatorKey)), "operator key ($MANTLE_OPERATOR_KEY), or a tenant key ($MANTLE_API_KEY)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "deadline for the call")
	var tlsFlags clientTLS
	tlsFlags.register(fs, env)
	fs.BoolVar(&c.json, "json", false, "print the response as JSON")
	run := sub(fs, c)
	positional, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	creds, err := tlsFlags.credentials()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	defer conn.Close()
	c.client = verifierv1.NewVerifierServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if c.key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.key)
	}
	return run(ctx, positional)
}

// reviewCLI is what every review subcommand shares.
type reviewCLI struct {
	stdout  io.Writer
	getenv  func(string) string
	addr    string
	key     string
	timeout time.Duration
	json    bool
	client  verifierv1.VerifierServiceClient
}

// reviewCommands register their flags and return the function that runs them.
var reviewCommands = map[string]func(fs *flag.FlagSet, c *reviewCLI) func(ctx context.Context, args []string) error{
	"list":   reviewList,
	"show":   reviewShow,
	"claim":  reviewClaim,
	"decide": reviewDecide,
	"audit":  reviewAudit,
}

// parseInterspersed parses flags that may come before or after positional arguments
// (mantle review decide rv_1 --verdict approve ...).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func defaultReviewer(getenv func(string) string) string {
	for _, name := range []string{"MANTLE_REVIEWER", "USER", "USERNAME"} {
		if v := getenv(name); v != "" {
			return v
		}
	}
	return ""
}

// enumValue maps a lower-case CLI word (knowledge_cutoff, knowledge-cutoff) to a proto enum
// value, listing the allowed words when it is not one of them.
func enumValue(flagName, word, prefix string, values map[string]int32) (int32, error) {
	key := prefix + strings.ToUpper(strings.ReplaceAll(word, "-", "_"))
	if v, ok := values[key]; ok && v != 0 {
		return v, nil
	}
	var allowed []string
	for name, v := range values {
		if v != 0 {
			allowed = append(allowed, strings.ToLower(strings.TrimPrefix(name, prefix)))
		}
	}
	slices.Sort(allowed)
	return 0, fmt.Errorf("--%s: want one of %s, got %q", flagName, strings.Join(allowed, ", "), word)
}

func enumWord(name, prefix string) string { return strings.ToLower(strings.TrimPrefix(name, prefix)) }

func (c *reviewCLI) printJSON(m proto.Message) error {
	out, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: false}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.stdout, string(out))
	return err
}

func oneID(args []string, required bool) (string, error) {
	switch {
	case len(args) > 1:
		return "", fmt.Errorf("want one review id, got %q", args)
	case len(args) == 1:
		return args[0], nil
	case required:
		return "", errors.New("a review id is required")
	}
	return "", nil
}

func reviewList(fs *flag.FlagSet, c *reviewCLI) func(context.Context, []string) error {
	state := fs.String("state", "", "only reviews in this state: pending, claimed, decided, timed_out (confirmations: pending, happened, not_happened, all)")
	scenario := fs.String("scenario", "", "only reviews of this scenario")
	limit := fs.Int("limit", 50, "at most this many reviews")
	confirmations := fs.Bool("confirmations", false, "list the actions whose outcome a person must confirm, not reviews (operators only)")
	tenant := fs.String("tenant", "", "with --confirmations: only this tenant's")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("list takes no arguments, got %q", args)
		}
		if *confirmations {
			if *scenario != "" {
				return errors.New("--scenario: confirmations have no scenario")
			}
			return c.listConfirmations(ctx, *state, *tenant, *limit)
		}
		if *tenant != "" {
			return errors.New("--tenant: only with --confirmations (a tenant key sees its own reviews)")
		}
		req := &verifierv1.ListReviewsRequest{Scenario: *scenario, PageSize: int32(*limit)}
		if *state != "" {
			v, err := enumValue("state", *state, "REVIEW_STATE_", verifierv1.ReviewState_value)
			if err != nil {
				return err
			}
			req.State = verifierv1.ReviewState(v)
		}
		resp, err := c.client.ListReviews(ctx, req)
		if err != nil {
			return describe(err)
		}
		if c.json {
			return c.printJSON(resp)
		}
		if len(resp.GetReviews()) == 0 {
			fmt.Fprintln(c.stdout, "no reviews")
			return nil
		}
		w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tSTATE\tSCENARIO\tRISK\tDUE\tCLAIMED BY\tREASON\tQUESTION")
		for _, r := range resp.GetReviews() {
			fmt.Fprintf(w, "%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\n", r.GetId(), enumWord(r.GetState().String(), "REVIEW_STATE_"),
				r.GetScenario(), r.GetRiskScore(), r.GetDueAt().AsTime().UTC().Format(time.RFC3339),
				dash(r.GetClaimedBy()), r.GetReason(), oneLine(r.GetQuestion(), 40))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if resp.GetNextPageToken() != "" {
			fmt.Fprintf(c.stdout, "(more: raise --limit)\n")
		}
		return nil
	}
}

func reviewShow(_ *flag.FlagSet, c *reviewCLI) func(context.Context, []string) error {
	return func(ctx context.Context, args []string) error {
		id, err := oneID(args, true)
		if err != nil {
			return err
		}
		resp, err := c.client.GetReview(ctx, &verifierv1.GetReviewRequest{ReviewId: id})
		if err != nil {
			return describe(err)
		}
		if c.json {
			return c.printJSON(resp)
		}
		printReview(c.stdout, resp.GetReview())
		return nil
	}
}

func printReview(w io.Writer, r *verifierv1.Review) {
	fmt.Fprintf(w, "review   %s (%s)\n", r.GetId(), enumWord(r.GetState().String(), "REVIEW_STATE_"))
	fmt.Fprintf(w, "request  %s  tenant %s  scenario %s  model %s\n", r.GetRequestId(), r.GetTenant(), r.GetScenario(), dash(r.GetModel()))
	fmt.Fprintf(w, "risk     %.2f  reason %s  signals %s\n", r.GetRiskScore(), r.GetReason(), dash(strings.Join(r.GetSignals(), ",")))
	fmt.Fprintf(w, "due      %s  then %s", r.GetDueAt().AsTime().UTC().Format(time.RFC3339), r.GetDefaultAction())
	if r.GetDefaultActionText() != "" {
		fmt.Fprintf(w, " (%q)", r.GetDefaultActionText())
	}
	fmt.Fprintln(w)
	if r.GetClaimedBy() != "" {
		fmt.Fprintf(w, "claimed  by %s until %s\n", r.GetClaimedBy(), r.GetLeaseExpiresAt().AsTime().UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "question %s\n", r.GetQuestion())
	fmt.Fprintf(w, "answer   %s\n", r.GetContent())
	if d := r.GetDecision(); d != nil {
		fmt.Fprintf(w, "decision %s by %s: root cause %s, corrective action %s\n", enumWord(d.GetVerdict().String(), "REVIEW_VERDICT_"),
			d.GetReviewer(), enumWord(d.GetRootCause().String(), "ROOT_CAUSE_"), enumWord(d.GetCorrectiveAction().String(), "CORRECTIVE_ACTION_"))
	}
}

func reviewClaim(fs *flag.FlagSet, c *reviewCLI) func(context.Context, []string) error {
	reviewer := fs.String("reviewer", defaultReviewer(c.getenv), "your name in the audit trail ($MANTLE_REVIEWER, $USER)")
	lease := fs.Duration("lease", 0, "how long the claim lasts (0: the verifier's default)")
	scenario := fs.String("scenario", "", "without an id: claim the next review of this scenario")
	return func(ctx context.Context, args []string) error {
		id, err := oneID(args, false)
		if err != nil {
			return err
		}
		req := &verifierv1.ClaimReviewRequest{ReviewId: id, Reviewer: *reviewer, Scenario: *scenario}
		if *lease > 0 {
			req.Lease = durationpb.New(*lease)
		}
		resp, err := c.client.ClaimReview(ctx, req)
		if err != nil {
			return describe(err)
		}
		if c.json {
			return c.printJSON(resp)
		}
		r := resp.GetReview()
		fmt.Fprintf(c.stdout, "claimed %s until %s\n\n", r.GetId(), r.GetLeaseExpiresAt().AsTime().UTC().Format(time.RFC3339))
		printReview(c.stdout, r)
		return nil
	}
}

// listConfirmations lists "confirm outcome" reviews: pending ones unless state says
// otherwise.
func (c *reviewCLI) listConfirmations(ctx context.Context, state, tenant string, limit int) error {
	req := &verifierv1.ListConfirmationsRequest{Tenant: tenant, PageSize: int32(limit)}
	switch state {
	case "":
		req.State = verifierv1.ConfirmationState_CONFIRMATION_STATE_PENDING
	case "all":
	default:
		v, err := enumValue("state", state, "CONFIRMATION_STATE_", verifierv1.ConfirmationState_value)
		if err != nil {
			return err
		}
		req.State = verifierv1.ConfirmationState(v)
	}
	resp, err := c.client.ListConfirmations(ctx, req)
	if err != nil {
		return describe(err)
	}
	if c.json {
		return c.printJSON(resp)
	}
	if len(resp.GetConfirmations()) == 0 {
		fmt.Fprintln(c.stdout, "no confirmations")
		return nil
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tSTATE\tTENANT\tTOOL\tKEY\tOPENED\tSEEN\tARGUMENTS")
	for _, cf := range resp.GetConfirmations() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cf.GetId(), enumWord(cf.GetState().String(), "CONFIRMATION_STATE_"),
			cf.GetTenant(), cf.GetTool(), cf.GetIdempotencyKey(), cf.GetCreatedAt().AsTime().UTC().Format(time.RFC3339),
			oneLine(cf.GetReason(), 40), oneLine(cf.GetArguments(), 60))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if resp.GetNextPageToken() != "" {
		fmt.Fprintf(c.stdout, "(more: raise --limit)\n")
	}
	return nil
}

// decideConfirmation records whether a confirmation's action happened.
func (c *reviewCLI) decideConfirmation(ctx context.Context, fs *flag.FlagSet, id, reviewer string, happened, notHappened bool, result, note string) error {
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "verdict", "root-cause", "action", "corrected", "draft-question-terms", "draft-answer-terms", "draft-knowledge":
			errs = append(errs, fmt.Errorf("--%s: a confirmation takes --happened or --not-happened, not a review verdict", f.Name))
		}
	})
	switch {
	case happened && notHappened:
		errs = append(errs, errors.New("--happened and --not-happened: give one"))
	case !happened && !notHappened:
		errs = append(errs, errors.New("a confirmation needs --happened or --not-happened"))
	case notHappened && result != "":
		errs = append(errs, errors.New("--result: only with --happened"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	req := &verifierv1.DecideConfirmationRequest{ConfirmationId: id, Reviewer: reviewer, Result: result, Note: note,
		Decision: verifierv1.ConfirmationState_CONFIRMATION_STATE_NOT_HAPPENED}
	if happened {
		req.Decision = verifierv1.ConfirmationState_CONFIRMATION_STATE_HAPPENED
	}
	resp, err := c.client.DecideConfirmation(ctx, req)
	if err != nil {
		return describe(err)
	}
	if c.json {
		return c.printJSON(resp)
	}
	cf := resp.GetConfirmation()
	fmt.Fprintf(c.stdout, "decided %s: %s (tenant %s, tool %s, key %s)\n", cf.GetId(), enumWord(cf.GetState().String(), "CONFIRMATION_STATE_"),
		cf.GetTenant(), cf.GetTool(), cf.GetIdempotencyKey())
	if happened {
		fmt.Fprintln(c.stdout, "the agent answers the key with this result and never runs the action again")
	} else {
		fmt.Fprintln(c.stdout, "the next call with the key runs the action")
	}
	return nil
}

func reviewDecide(fs *flag.FlagSet, c *reviewCLI) func(context.Context, []string) error {
	reviewer := fs.String("reviewer", defaultReviewer(c.getenv), "your name; you must hold the claim ($MANTLE_REVIEWER, $USER)")
	verdict := fs.String("verdict", "", "approve, reject or correct")
	rootCause := fs.String("root-cause", "", "none, knowledge_cutoff, context_truncation, term_misread, hallucination, rule_violation, format_error, prompt_defect or other")
	action := fs.String("action", "", "corrective action: none, append_knowledge, adjust_prompt, block_tokens, add_rule or route_to_fresher_model")
	corrected := fs.String("corrected", "", "the corrected answer (for --verdict correct)")
	note := fs.String("note", "", "a note for the audit trail")
	questionTerms := fs.String("draft-question-terms", "", "draft an L2 rule: comma-separated terms the question contains")
	answerTerms := fs.String("draft-answer-terms", "", "draft an L2 rule: comma-separated terms of which the answer contains one")
	knowledge := fs.String("draft-knowledge", "", "draft an L2 rule: the knowledge snippet to add (append_knowledge)")
	happened := fs.Bool("happened", false, "a confirmation (cf_...): the action happened")
	notHappened := fs.Bool("not-happened", false, "a confirmation (cf_...): the action did not happen; the next call with its key runs it")
	result := fs.String("result", "", "with --happened: the action's result as you found it (JSON, or text)")
	return func(ctx context.Context, args []string) error {
		id, err := oneID(args, true)
		if err != nil {
			return err
		}
		if *happened || *notHappened || *result != "" || strings.HasPrefix(id, "cf_") {
			return c.decideConfirmation(ctx, fs, id, *reviewer, *happened, *notHappened, *result, *note)
		}
		req := &verifierv1.DecideReviewRequest{ReviewId: id, Reviewer: *reviewer, CorrectedContent: *corrected, Note: *note}
		var errs []error
		if v, err := enumValue("verdict", *verdict, "REVIEW_VERDICT_", verifierv1.ReviewVerdict_value); err != nil {
			errs = append(errs, err)
		} else {
			req.Verdict = verifierv1.ReviewVerdict(v)
		}
		if v, err := enumValue("root-cause", *rootCause, "ROOT_CAUSE_", verifierv1.RootCause_value); err != nil {
			errs = append(errs, err)
		} else {
			req.RootCause = verifierv1.RootCause(v)
		}
		if v, err := enumValue("action", *action, "CORRECTIVE_ACTION_", verifierv1.CorrectiveAction_value); err != nil {
			errs = append(errs, err)
		} else {
			req.CorrectiveAction = verifierv1.CorrectiveAction(v)
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if *questionTerms != "" || *answerTerms != "" || *knowledge != "" {
			req.DraftRule = &verifierv1.DraftRuleHint{
				QuestionTerms: splitList(*questionTerms), AnswerTerms: splitList(*answerTerms), Knowledge: *knowledge,
			}
		}
		resp, err := c.client.DecideReview(ctx, req)
		if err != nil {
			return describe(err)
		}
		if c.json {
			return c.printJSON(resp)
		}
		d := resp.GetReview().GetDecision()
		fmt.Fprintf(c.stdout, "decided %s: %s (root cause %s, corrective action %s)\n", resp.GetReview().GetId(),
			enumWord(d.GetVerdict().String(), "REVIEW_VERDICT_"), enumWord(d.GetRootCause().String(), "ROOT_CAUSE_"),
			enumWord(d.GetCorrectiveAction().String(), "CORRECTIVE_ACTION_"))
		if r := resp.GetDraftRule(); r != nil {
			fmt.Fprintf(c.stdout, "drafted rule %s for approval: when %s -> %s\n", r.GetId(), r.GetRule().GetCondition(), r.GetRule().GetAction().GetType())
		}
		return nil
	}
}

func reviewAudit(fs *flag.FlagSet, c *reviewCLI) func(context.Context, []string) error {
	actor := fs.String("actor", "", "only entries of this reviewer (or verifier)")
	limit := fs.Int("limit", 100, "at most this many entries")
	return func(ctx context.Context, args []string) error {
		id, err := oneID(args, false)
		if err != nil {
			return err
		}
		resp, err := c.client.ListReviewAudit(ctx, &verifierv1.ListReviewAuditRequest{ReviewId: id, Actor: *actor, PageSize: int32(*limit)})
		if err != nil {
			return describe(err)
		}
		if c.json {
			return c.printJSON(resp)
		}
		w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "TIME\tREVIEW\tACTOR\tACTION\tDETAIL")
		for _, e := range resp.GetEntries() {
			detail := e.GetDetail()
			if e.GetDraftRuleId() != "" {
				detail = strings.TrimSpace("rule " + e.GetDraftRuleId() + " " + detail)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", e.GetAt().AsTime().UTC().Format(time.RFC3339), e.GetReviewId(), e.GetActor(), e.GetAction(), oneLine(detail, 80))
		}
		return w.Flush()
	}
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine flattens s and cuts it to n runes for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
