// `moecore tokenize` and `moecore detokenize`: text files to token files and
// back (the format is in tokenizer.h).
//
// tokenize streams its inputs line by line, so memory stays at one line
// whatever the corpus size. Which output a document goes to depends only on
// its number, so the train/eval split is the same on every run and machine.
// Outputs are written to PATH.tmp and renamed only once every input has been
// read and every byte written: a failure leaves an existing PATH untouched.
#include "data/tokenizer.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/check.h"

#define CHUNK 4096  // ids encoded, written or decoded at a time

// ---------------------------------------------------------------------------
// Command-line helpers shared by both commands.

// Matches argv[*i] against option `name`, given as "NAME VALUE" or
// "NAME=VALUE". Returns 1 and sets *value on a match (advancing *i past a
// separate value), 0 when argv[*i] is something else, -1 when the value is
// missing.
static int option(int argc, char **argv, int *i, const char *name, const char **value) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return 0;
    if (argv[*i][n] == '=') {
        *value = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0') return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "moecore: error: %s needs a value\n", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

// Parses a whole decimal number >= min for option `name`.
static int parse_count(const char *name, const char *s, long long min, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min) {
        fprintf(stderr, "moecore: error: %s '%s': expected a whole number >= %lld\n", name, s, min);
        return -1;
    }
    *out = v;
    return 0;
}

// ---------------------------------------------------------------------------
// One output token file, written to a temporary path until committed.

typedef struct {
    const char *path;
    char *tmp_path;
    FILE *f;
    uint64_t docs, tokens;
} TokenOutput;

static int output_open(TokenOutput *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->path = path;
    o->tmp_path = mallocCheck(strlen(path) + 5);
    sprintf(o->tmp_path, "%s.tmp", path);
    o->f = fopen(o->tmp_path, "wb");
    if (!o->f) {
        fprintf(stderr, "moecore: error: cannot create '%s': %s\n", o->tmp_path, strerror(errno));
        return -1;
    }
    return 0;
}

static int output_ids(TokenOutput *o, const uint16_t *ids, size_t n) {
    unsigned char le[2 * CHUNK];
    for (size_t done = 0; done < n;) {
        size_t m = n - done < CHUNK ? n - done : CHUNK;
        for (size_t i = 0; i < m; i++) {
            le[2 * i] = (unsigned char)(ids[done + i] & 0xff);
            le[2 * i + 1] = (unsigned char)(ids[done + i] >> 8);
        }
        if (fwrite(le, 2, m, o->f) != m) {
            fprintf(stderr, "moecore: error: cannot write '%s': %s\n", o->tmp_path, strerror(errno));
            return -1;
        }
        done += m;
    }
    o->tokens += n;
    return 0;
}

static int output_text(TokenOutput *o, const unsigned char *text, size_t len) {
    uint16_t ids[CHUNK];
    for (size_t done = 0; done < len;) {
        size_t m = len - done < CHUNK ? len - done : CHUNK;
        tokenizer_encode(text + done, m, ids);
        if (output_ids(o, ids, m)) return -1;
        done += m;
    }
    return 0;
}

static int output_end_document(TokenOutput *o) {
    const uint16_t eos = TOKENIZER_EOS;
    if (output_ids(o, &eos, 1)) return -1;
    o->docs++;
    return 0;
}

// Closes the file; write errors that buffering delayed surface here.
static int output_close(TokenOutput *o) {
    FILE *f = o->f;
    o->f = NULL;
    if (ferror(f) | fclose(f)) {
        fprintf(stderr, "moecore: error: cannot write '%s': %s\n", o->tmp_path, strerror(errno));
        return -1;
    }
    return 0;
}

static int output_rename(TokenOutput *o) {
    if (rename(o->tmp_path, o->path)) {
        fprintf(stderr, "moecore: error: cannot rename '%s' to '%s': %s\n", o->tmp_path, o->path,
                strerror(errno));
        return -1;
    }
    return 0;
}

// Drops the temporary file, leaving o->path as it was.
static void output_discard(TokenOutput *o) {
    if (o->f) fclose(o->f);
    o->f = NULL;
    if (o->tmp_path) remove(o->tmp_path);
}

// ---------------------------------------------------------------------------
// Documents: numbered from 1 in input order as their first byte arrives, so
// empty ones (two separators in a row, a file ending in one) take no number
// and get no EOS. Number d goes to the eval output when eval_every divides d.

typedef struct {
    TokenOutput *train, *eval;  // eval is NULL without --eval-out
    long long eval_every;
    TokenOutput *open;          // the open document's output; NULL between documents
    uint64_t docs;
} DocumentSplit;

static int document_text(DocumentSplit *s, const unsigned char *text, size_t len) {
    if (len == 0) return 0;
    if (!s->open) {
        s->docs++;
        s->open = s->eval && s->docs % (uint64_t)s->eval_every == 0 ? s->eval : s->train;
    }
    return output_text(s->open, text, len);
}

static int document_end(DocumentSplit *s) {
    if (!s->open) return 0;
    TokenOutput *o = s->open;
    s->open = NULL;
    return output_end_document(o);
}

// Feeds one input file: it ends a document, and so does each line that is
// exactly `separator` (not counting its '\n'), which is itself dropped.
static int tokenize_file(DocumentSplit *s, const char *path, const char *separator, uint64_t *bytes_read) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "moecore: error: cannot open input '%s': %s\n", path, strerror(errno));
        return -1;
    }
    size_t sep_len = separator ? strlen(separator) : 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    errno = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) > 0) {
        *bytes_read += (uint64_t)n;
        size_t content = (size_t)n - (line[n - 1] == '\n');
        if (separator && content == sep_len && memcmp(line, separator, sep_len) == 0)
            rc = document_end(s);
        else
            rc = document_text(s, (const unsigned char *)line, (size_t)n);
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "moecore: error: cannot read input '%s': %s\n", path, strerror(errno));
        rc = -1;
    }
    if (rc == 0) rc = document_end(s);
    free(line);
    fclose(f);
    return rc;
}

// Tokenizes the files into train (and eval, when eval_path is set); prints
// the summary. 0 on success; on failure -1, with no output path touched.
static int tokenize_files(char **files, int nfiles, const char *separator, const char *out_path,
                          const char *eval_path, long long eval_every) {
    TokenOutput train = {0}, eval = {0};
    DocumentSplit split = {.train = &train, .eval = eval_path ? &eval : NULL, .eval_every = eval_every};
    uint64_t bytes_read = 0;
    int rc = output_open(&train, out_path);
    if (rc == 0 && eval_path) rc = output_open(&eval, eval_path);
    for (int i = 0; rc == 0 && i < nfiles; i++) rc = tokenize_file(&split, files[i], separator, &bytes_read);
    if (rc == 0) rc = output_close(&train);
    if (rc == 0 && eval_path) rc = output_close(&eval);
    if (rc == 0) rc = output_rename(&train);
    if (rc == 0 && eval_path) rc = output_rename(&eval);
    if (rc) {
        output_discard(&train);
        output_discard(&eval);
    } else {
        printf("tokenize: %d files, %" PRIu64 " bytes read, %" PRIu64 " documents\n", nfiles, bytes_read,
               split.docs);
        const TokenOutput *outs[2] = {&train, eval_path ? &eval : NULL};
        for (int k = 0; k < 2 && outs[k]; k++)
            printf("  %-5s %s: %" PRIu64 " documents, %" PRIu64 " tokens (%" PRIu64 " text bytes + %" PRIu64
                   " EOS), %" PRIu64 " bytes on disk\n",
                   k ? "eval" : "train", outs[k]->path, outs[k]->docs, outs[k]->tokens,
                   outs[k]->tokens - outs[k]->docs, outs[k]->docs, 2 * outs[k]->tokens);
        if (eval_path && eval.docs == 0)
            fprintf(stderr, "moecore: warning: no document fell in the eval split (fewer than %lld documents)\n",
                    eval_every);
    }
    free(train.tmp_path);
    free(eval.tmp_path);
    return rc;
}

// An output that is also an input would be replaced (the rename of PATH.tmp
// over PATH) or truncated (opening PATH.tmp, which follows symlinks) by
// what is read from it: refused, with a message. An input is PATH when it
// resolves to PATH's own directory entry, and PATH.tmp when it resolves to
// the same file. 0 when no output is an input.
static int output_is_input(const char *option, const char *out, char **files, int nfiles) {
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    const char *paths[2] = {out, tmp};
    for (int k = 0; k < 2; k++) {
        struct stat so, si;
        if (k ? stat(paths[k], &so) : lstat(paths[k], &so)) continue;   // not there: not an input
        for (int i = 0; i < nfiles; i++)
            if (!stat(files[i], &si) && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
                fprintf(stderr, "moecore: error: %s '%s'%s%s%s is the input file '%s': tokenize would overwrite its "
                        "own input; write to another path\n", option, out, k ? " writes '" : "", k ? tmp : "",
                        k ? "' first, which" : "", files[i]);
                return -1;
            }
    }
    return 0;
}

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: moecore tokenize [--separator LINE] --out TRAIN.bin\n"
            "                        [--eval-out EVAL.bin [--eval-every K]] FILE...\n"
            "\n"
            "Encodes the text files, in the order given, with the byte-level tokenizer\n"
            "(ids 0..255 are the bytes, 256 is EOS; vocabulary 257) into a token file\n"
            "of uint16 little-endian ids without header. Each file is one document, or\n"
            "several with --separator; an EOS follows every document; empty documents\n"
            "are dropped. The bytes are taken as they are: no normalisation.\n"
            "\n"
            "  --out PATH         the token file to write (required)\n"
            "  --separator LINE   a line that is exactly LINE (before its newline) also\n"
            "                     ends a document and is itself dropped; e.g. '%%' for\n"
            "                     fortune files, '' for blank lines\n"
            "  --eval-out PATH    held-out split: documents number K, 2K, 3K, ...\n"
            "                     (counted from 1 over all files) go here, not to --out\n"
            "  --eval-every K     the K of --eval-out (default 20, i.e. 5%%; at least 2)\n"
            "  --help             this text\n"
            "\n"
            "Outputs are written to PATH.tmp and renamed when complete, so a failure\n"
            "leaves an existing PATH untouched; an output (or its PATH.tmp) that is also\n"
            "an input is refused. Prints the documents, bytes and tokens written to\n"
            "each file.\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *out_path = NULL, *eval_path = NULL, *separator = NULL, *every_text = NULL;
    long long eval_every = 20;
    char **files = mallocCheck((size_t)(argc + 1) * sizeof *files);
    int nfiles = 0, rc = 2;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int m;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tokenize_usage(stdout);
            rc = 0;
            goto done;
        }
        if (!strcmp(a, "--")) {  // everything after is a file, even "-x"
            while (++i < argc) files[nfiles++] = argv[i];
            break;
        }
        if ((m = option(argc, argv, &i, "--out", &out_path)) ||
            (m = option(argc, argv, &i, "--eval-out", &eval_path)) ||
            (m = option(argc, argv, &i, "--eval-every", &every_text)) ||
            (m = option(argc, argv, &i, "--separator", &separator))) {
            if (m < 0) goto done;
            continue;
        }
        if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "moecore: error: tokenize: unknown option '%s' (see moecore tokenize --help)\n", a);
            goto done;
        }
        files[nfiles++] = argv[i];
    }
    if (!out_path || nfiles == 0) {
        fprintf(stderr, "moecore: error: tokenize needs --out PATH and at least one input file "
                        "(see moecore tokenize --help)\n");
    } else if (every_text && !eval_path) {
        fprintf(stderr, "moecore: error: --eval-every needs --eval-out\n");
    } else if (every_text && parse_count("--eval-every", every_text, 2, &eval_every)) {
        // message printed
    } else if (eval_path && !strcmp(eval_path, out_path)) {
        fprintf(stderr, "moecore: error: --out and --eval-out are the same path '%s'\n", out_path);
    } else if (separator && strchr(separator, '\n')) {
        fprintf(stderr, "moecore: error: --separator must be a single line\n");
    } else if (output_is_input("--out", out_path, files, nfiles) ||
               (eval_path && output_is_input("--eval-out", eval_path, files, nfiles))) {
        // message printed
    } else {
        rc = tokenize_files(files, nfiles, separator, out_path, eval_path, eval_every) ? 1 : 0;
    }
done:
    free(files);
    return rc;
}

// ---------------------------------------------------------------------------

static void detokenize_usage(FILE *f) {
    fprintf(f,
            "usage: moecore detokenize FILE.bin [--offset N] [--count N]\n"
            "\n"
            "Prints the tokens of a token file as text on stdout: bytes as they are,\n"
            "EOS as \"\\n<|eos|>\\n\", ids above 256 as '?'.\n"
            "\n"
            "  --offset N   the first token to print, counted from 0 (default 0)\n"
            "  --count N    how many tokens to print (default: up to the end)\n"
            "  --help       this text\n");
}

int cmd_detokenize(int argc, char **argv) {
    const char *path = NULL, *offset_text = NULL, *count_text = NULL;
    long long offset = 0, count = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int m;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            detokenize_usage(stdout);
            return 0;
        }
        if ((m = option(argc, argv, &i, "--offset", &offset_text)) ||
            (m = option(argc, argv, &i, "--count", &count_text))) {
            if (m < 0) return 2;
            continue;
        }
        if ((a[0] == '-' && a[1] != '\0') || path) {
            fprintf(stderr, "moecore: error: detokenize: unexpected argument '%s' (see moecore detokenize --help)\n",
                    a);
            return 2;
        }
        path = a;
    }
    if (!path) {
        detokenize_usage(stderr);
        return 2;
    }
    if (offset_text && parse_count("--offset", offset_text, 0, &offset)) return 2;
    if (count_text && parse_count("--count", count_text, 0, &count)) return 2;

    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st)) {
        fprintf(stderr, "moecore: error: cannot open token file '%s': %s\n", path, strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    if (!S_ISREG(st.st_mode) || st.st_size % 2) {
        fprintf(stderr, "moecore: error: '%s' is not a token file (%s)\n", path,
                S_ISREG(st.st_mode) ? "odd size in bytes" : "not a regular file");
        fclose(f);
        return 1;
    }
    long long ntokens = (long long)(st.st_size / 2);
    if (offset > ntokens) {
        fprintf(stderr, "moecore: error: --offset %lld is past the end of '%s' (%lld tokens)\n", offset, path,
                ntokens);
        fclose(f);
        return 1;
    }
    long long left = count < 0 || count > ntokens - offset ? ntokens - offset : count;
    if (fseeko(f, (off_t)offset * 2, SEEK_SET)) {
        fprintf(stderr, "moecore: error: cannot seek in '%s': %s\n", path, strerror(errno));
        fclose(f);
        return 1;
    }

    static unsigned char le[2 * CHUNK];
    static int ids[CHUNK];
    static char text[CHUNK * TOKENIZER_MAX_PIECE + 1];
    long long out_of_range = 0;
    int rc = 0;
    while (left > 0) {
        size_t m = left < CHUNK ? (size_t)left : CHUNK;
        if (fread(le, 2, m, f) != m) {
            fprintf(stderr, "moecore: error: cannot read '%s': %s\n", path,
                    ferror(f) ? strerror(errno) : "file shrank while reading");
            rc = 1;
            break;
        }
        for (size_t i = 0; i < m; i++) {
            ids[i] = le[2 * i] | le[2 * i + 1] << 8;
            out_of_range += ids[i] >= TOKENIZER_VOCAB_SIZE;
        }
        size_t len = tokenizer_decode(ids, (int)m, text, sizeof text);
        if (fwrite(text, 1, len, stdout) != len) {
            fprintf(stderr, "moecore: error: cannot write to stdout: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        left -= (long long)m;
    }
    fclose(f);
    if (fflush(stdout)) {
        fprintf(stderr, "moecore: error: cannot write to stdout: %s\n", strerror(errno));
        rc = 1;
    }
    if (out_of_range)
        fprintf(stderr, "moecore: warning: %lld ids of '%s' were outside the vocabulary (shown as '?')\n",
                out_of_range, path);
    return rc;
}
