/* embed_example: the smallest program embedding hybrid through engine.h, written in C to prove the header is
 * valid C. Loads a model folder, generates from a prompt and prints the continuation (stdout), then a one-line
 * summary (stderr).
 *
 *   embed_example MODEL_DIR [PROMPT] [N_TOKENS] [N_THREADS]
 *
 * Greedy decoding (temperature 0), CPU backend, N_TOKENS in [1, 1000000] (default 32; the context holds 1024),
 * N_THREADS CPU threads in [0, 1024] (default 0: all cores). Exit status: 0 on success, 1 on a usage error (bad
 * count, empty prompt), 2 when the model cannot be loaded, 3 when the prompt does not fit the context, 5 when the
 * output cannot be written, 6 when generation fails (hybrid's codes).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* Parses a whole decimal integer in [lo, hi] into *out; 0 when s is not one (sign, trailing text, overflow). */
static int parse_int(const char* s, long lo, long hi, int* out) {
    char* end = NULL;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int print_token(const hy_token_info* token, void* user_data) {
    double* logprob_sum = (double*)user_data;
    if (token->id >= 0) *logprob_sum += token->logprob;
    fwrite(token->text, 1, token->text_len, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop generation */
}

int main(int argc, char** argv) {
    const char* dir;
    const char* prompt = "def main():\n    ";
    int n_tokens = 32;
    int n_threads = 0;
    hy_model_params mp;
    hy_sampler_params sp;
    hy_generate_params gp;
    hy_generate_result result;
    hy_model* model = NULL;
    hy_context* ctx = NULL;
    hy_sampler* sampler = NULL;
    int32_t* ids = NULL;
    int n_ids = 0;
    double logprob_sum = 0.0;
    int rc = 0, gen_rc = HY_OK;

    if (argc < 2 || argc > 5) {
        fprintf(stderr, "embed_example: usage: %s MODEL_DIR [PROMPT] [N_TOKENS] [N_THREADS]\n", argv[0]);
        return 1;
    }
    dir = argv[1];
    if (argc > 2) prompt = argv[2];
    if (argc > 2 && prompt[0] == '\0') {
        fprintf(stderr, "embed_example: error: the prompt is empty\n");
        return 1;
    }
    if (argc > 3 && !parse_int(argv[3], 1, 1000000, &n_tokens)) {
        fprintf(stderr, "embed_example: error: N_TOKENS must be an integer in [1, 1000000], got '%s'\n", argv[3]);
        return 1;
    }
    if (argc > 4 && !parse_int(argv[4], 0, 1024, &n_threads)) {
        fprintf(stderr, "embed_example: error: N_THREADS must be an integer in [0, 1024], got '%s'\n", argv[4]);
        return 1;
    }

    mp = hy_model_default_params();
    mp.device = HY_DEVICE_CPU;
    mp.n_threads = n_threads;
    mp.n_ctx = 1024;
    if (hy_model_load(dir, &mp, &model) != HY_OK) {
        fprintf(stderr, "embed_example: error: %s\n", hy_last_error());
        return 2;
    }

    /* tokenize: ask for the size first, then fill */
    if (hy_tokenize(model, prompt, -1, 1, NULL, 0, &n_ids) != HY_OK && n_ids == 0) {
        fprintf(stderr, "embed_example: error: %s\n", hy_last_error());
        rc = 6;
        goto done;
    }
    ids = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n_ids > 0 ? n_ids : 1));
    if (!ids || hy_tokenize(model, prompt, -1, 1, ids, n_ids, &n_ids) != HY_OK) {
        fprintf(stderr, "embed_example: error: %s\n", ids ? hy_last_error() : "out of memory");
        rc = 6;
        goto done;
    }

    sp = hy_sampler_default_params();
    sp.temperature = 0.0f;
    if (hy_context_new(model, NULL, &ctx) != HY_OK || hy_sampler_new(model, &sp, &sampler) != HY_OK) {
        fprintf(stderr, "embed_example: error: %s\n", hy_last_error());
        rc = 6;
        goto done;
    }

    gp = hy_generate_default_params();
    gp.max_tokens = n_tokens;
    gp.on_token = print_token;
    gp.user_data = &logprob_sum;
    gen_rc = hy_generate(ctx, sampler, ids, n_ids, &gp, &result);
    if (gen_rc != HY_OK) {
        fprintf(stderr, "\nembed_example: error: %s\n", hy_last_error());
        rc = gen_rc == HY_ERR_CONTEXT_FULL ? 3 : 6;
        goto done;
    }
    printf("\n");
    /* the continuation's line before the summary when both go to one terminal; a lost write is an error */
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "embed_example: error: cannot write to stdout: %s\n", strerror(errno != 0 ? errno : EIO));
        rc = 5;
        goto done;
    }
    fprintf(stderr, "embed_example: %d prompt token%s, %d generated (stop: %s), sum of log-probabilities %.3f\n",
            result.n_prompt, result.n_prompt == 1 ? "" : "s", result.n_generated,
            hy_stop_reason_name(result.stop_reason), logprob_sum);

done:
    free(ids);
    hy_sampler_free(sampler);
    hy_context_free(ctx);
    hy_model_free(model);
    return rc;
}
