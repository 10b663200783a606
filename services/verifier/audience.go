package verifier

import (
	verifierv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/verifier/v1"
	"github.com/mantle-mesh/mantle/pkg/rpc"
)

// Audiences says who may call each VerifierService method. The review workbench is on the
// tenant plane: a tenant reads and decides its own reviews (Server.scope), an operator
// every tenant's. What changes answers for every tenant — approving a draft rule,
// reloading the rules — is the operator's alone.
var Audiences = rpc.Audiences{
	verifierv1.VerifierService_Verify_FullMethodName:          rpc.AudienceService,
	verifierv1.VerifierService_GetFollowUp_FullMethodName:     rpc.AudienceTenant,
	verifierv1.VerifierService_ReportFeedback_FullMethodName:  rpc.AudienceTenant,
	verifierv1.VerifierService_ListReviews_FullMethodName:     rpc.AudienceTenant,
	verifierv1.VerifierService_GetReview_FullMethodName:       rpc.AudienceTenant,
	verifierv1.VerifierService_ClaimReview_FullMethodName:     rpc.AudienceTenant,
	verifierv1.VerifierService_DecideReview_FullMethodName:    rpc.AudienceTenant,
	verifierv1.VerifierService_ListReviewAudit_FullMethodName: rpc.AudienceTenant,
	verifierv1.VerifierService_ListDraftRules_FullMethodName:  rpc.AudienceTenant,
	verifierv1.VerifierService_DecideDraftRule_FullMethodName: rpc.AudienceOperator,
	verifierv1.VerifierService_ReloadRules_FullMethodName:     rpc.AudienceOperator,
	// An action's outcome is confirmed by a person, never by the tenant whose agent ran
	// it: the agent opens and reads confirmations (service plane), operators decide.
	verifierv1.VerifierService_OpenConfirmation_FullMethodName:   rpc.AudienceService,
	verifierv1.VerifierService_GetConfirmation_FullMethodName:    rpc.AudienceService,
	verifierv1.VerifierService_ListConfirmations_FullMethodName:  rpc.AudienceOperator,
	verifierv1.VerifierService_DecideConfirmation_FullMethodName: rpc.AudienceOperator,
}
