/**
 * Request bodies as zod schemas: one definition gives the typed input, every problem of a body at
 * once (400 invalid_body with `errors: [{field, code, message}]`), and the OpenAPI document
 * (openapi.ts). Unknown fields are refused (strict objects): a misspelt knob must not be silently
 * ignored. Limits come from the configuration, so the schemas are built per app.
 */
import { z } from 'zod';
import type { Config } from '../config/config.js';
import { HttpError } from './errors.js';
import { MAX_TOP_LOGPROBS } from '../generate/logprobs.js';

/** One problem of a request body: the field's path (dots and [i]), unknown_field or invalid_field, and why. */
export interface FieldError {
  field: string;
  code: 'unknown_field' | 'invalid_field' | 'invalid_body';
  message: string;
}

const stop = z.union([z.string().min(1).max(256), z.array(z.string().min(1).max(256)).max(8)])
  .describe('Generation ends before the first of these texts (finish_reason "stop"); the text is not part of the output.');

const jsonSchemaObject = z.record(z.string(), z.unknown());

/** OpenAI's response_format: enforced by constrained decoding (a schema outside the supported subset is refused, naming the keyword). */
export const responseFormat = z.union([
  z.strictObject({ type: z.literal('text') }),
  z.strictObject({ type: z.literal('json_object') }),
  z.strictObject({
    type: z.literal('json_schema'),
    json_schema: z.strictObject({
      name: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, 'json_schema.name must be 1-64 letters, digits, _ or -'),
      description: z.string().optional(),
      schema: jsonSchemaObject.optional().describe('Objects, arrays, strings, numbers, integers, booleans, null, enum, const, required, additionalProperties, anyOf.'),
      strict: z.boolean().nullable().optional().describe('Accepted; the schema is always enforced.'),
    }),
  }),
]).describe('text, json_object (any JSON object) or json_schema: the output is generated to parse (and validate).');

/** Sampling fields shared by /query and the /v1 routes (the token top-k's name differs: see each route). */
function sampling(cfg: Config) {
  return {
    temperature: z.number().min(0).max(5).optional().describe('0 is greedy; the default is 0 on /query, 1 (OpenAI\'s) on /v1.'),
    top_p: z.number().gt(0).max(1).optional().describe('Nucleus sampling: the smallest set of tokens whose probability reaches top_p.'),
    seed: z.number().int().min(Number.MIN_SAFE_INTEGER).max(Number.MAX_SAFE_INTEGER).optional()
      .describe('Seeds the sampler: the same request gives the same output (without one, each request draws its own).'),
    stop: stop.optional(),
    repetition_penalty: z.number().gt(0).max(10).optional().describe('vLLM\'s: >1 discourages tokens already in the prompt or output; 1 is off.'),
    presence_penalty: z.number().min(-2).max(2).optional().describe('OpenAI\'s: subtracted from the logit of every token already generated.'),
    frequency_penalty: z.number().min(-2).max(2).optional().describe('OpenAI\'s: subtracted once per occurrence in the output so far.'),
    stream: z.boolean().optional().describe('Server-sent events instead of one JSON reply.'),
    response_format: responseFormat.optional(),
    _maxTokens: z.number().int().min(1).max(cfg.maxNewTokensLimit).describe('New tokens at most (RAGGUARD_MAX_NEW_TOKENS_LIMIT).'),
  };
}

export const COLLECTION = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const FIELD = /^[A-Za-z_][A-Za-z0-9_.-]{0,63}$/;

export const collectionSchema = z.string().regex(COLLECTION, `collection must match ${COLLECTION.source}`)
  .describe("The collection: documents live in one, and a query searches one ('default' when left out).");

const metadataValue = z.union([z.string().max(1024), z.number().finite(), z.boolean()]);
const fieldName = z.string().regex(FIELD, `a metadata field name must match ${FIELD.source}`);

export const metadataSchema = z.record(fieldName, metadataValue)
  .refine((m) => Object.keys(m).length <= 64, 'at most 64 metadata fields')
  .describe('Metadata of the document: field names to strings, numbers or booleans.');

/** A search filter: the collection, and metadata conditions (equality, or `in` a list) that every hit meets. */
export const filterSchema = z.strictObject({
  collection: collectionSchema.optional(),
  metadata: z.record(fieldName, z.union([metadataValue, z.strictObject({ in: z.array(metadataValue).min(1).max(256) })]))
    .refine((m) => Object.keys(m).length <= 32, 'at most 32 metadata conditions').optional()
    .describe('field: value (equal) or field: {in: [values]} (one of them); every condition must hold. Applied inside the search: top_k stays full.'),
}).describe('Which chunks may be retrieved.');

const tokenTopK = z.number().int().min(-1).max(100000).optional().describe('Sample from the top_k most likely tokens; 0 or -1: all; 1: greedy.');

export function querySchema(cfg: Config) {
  const { _maxTokens, ...s } = sampling(cfg);
  return z.strictObject({
    query: z.string().trim().min(1, 'query must be a non-empty string').describe('The question.'),
    top_k: z.number().int().min(1).max(cfg.maxTopK).default(cfg.defaultTopK).describe('Hits retrieved from the index.'),
    rerank_top_n: z.number().int().min(1).max(cfg.maxRerankTopN).default(cfg.defaultRerankTopN).describe('Hits kept after reranking.'),
    max_new_tokens: _maxTokens.default(cfg.defaultMaxNewTokens),
    adapter: z.string().nullable().optional().describe('A LoRA adapter under RAGGUARD_ADAPTER_DIR; null: the base model; absent: RAGGUARD_QUERY_ADAPTER\'s (the shipped grounded adapter by default).'),
    collection: collectionSchema.optional(),
    filter: filterSchema.optional(),
    sample_top_k: tokenTopK.describe('The sampler\'s top-k (top_k here is retrieval\'s): 0 or -1 all tokens, 1 greedy.'),
    ...s,
  });
}

const DOC_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** A file in JSON: its bytes as base64, its name (its extension picks the parser unless content_type does). */
export const fileFields = {
  content: z.string().transform((c) => c.replace(/\s+/g, '')).refine((c) => c.length > 0 && c.length % 4 !== 1 && BASE64.test(c), 'content must be base64')
    .optional().describe('The file\'s bytes, base64 (instead of text): PDF, DOCX, HTML, Markdown or plain text.'),
  filename: z.string().min(1).max(255).optional().describe('With content: the file\'s name; its extension picks the parser unless content_type names one.'),
  content_type: z.string().min(1).max(255).optional().describe('With content: its MIME type (a charset parameter is honoured for text).'),
};

/** Exactly one of text and content; filename and content_type only with content, filename required with it. */
export function textOrFile(d: { text?: string | undefined; content?: string | undefined; filename?: string | undefined; content_type?: string | undefined }, ctx: z.RefinementCtx): void {
  if ((d.text === undefined) === (d.content === undefined)) ctx.addIssue({ code: 'custom', message: 'give either text or content (a base64 file with its filename)', path: [] });
  if (d.content !== undefined && d.filename === undefined) ctx.addIssue({ code: 'custom', message: 'filename is required with content', path: ['filename'] });
  if (d.content === undefined && (d.filename !== undefined || d.content_type !== undefined)) {
    ctx.addIssue({ code: 'custom', message: 'filename and content_type go with content', path: [d.filename !== undefined ? 'filename' : 'content_type'] });
  }
}

const documentSchema = z.strictObject({
  doc_id: z.string().regex(DOC_ID, `doc_id must match ${DOC_ID.source}`).optional(),
  title: z.string().max(512).optional(),
  text: z.string().refine((t) => t.trim() !== '', 'text must be a non-empty string').optional(),
  collection: collectionSchema.optional(),
  metadata: metadataSchema.optional(),
  ...fileFields,
}).superRefine(textOrFile);

export const documentsSchema = z.union([
  documentSchema,
  z.strictObject({ documents: z.array(documentSchema).min(1).max(1000) }),
]);

const messageContent = z.union([
  z.string(),
  z.array(z.strictObject({ type: z.literal('text'), text: z.string() })).min(1)
    .describe('Text parts only: they are joined.'),
]);

const toolCall = z.strictObject({
  id: z.string(),
  type: z.literal('function'),
  function: z.strictObject({ name: z.string(), arguments: z.string() }),
});

const message = z.union([
  z.strictObject({
    role: z.enum(['system', 'developer', 'user']),
    content: messageContent,
    name: z.string().optional().describe('Accepted, not used.'),
  }),
  z.strictObject({
    role: z.literal('assistant'),
    content: messageContent.nullable().optional(),
    name: z.string().optional().describe('Accepted, not used.'),
    tool_calls: z.array(toolCall).optional().describe('Calls the assistant made (rendered back through the chat template).'),
    refusal: z.string().nullable().optional(),
  }),
  z.strictObject({
    role: z.literal('tool'),
    content: messageContent,
    tool_call_id: z.string().describe('The id of the call this answers.'),
  }),
]);

const tool = z.strictObject({
  type: z.literal('function'),
  function: z.strictObject({
    name: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, 'a function name must be 1-64 letters, digits, _ or -'),
    description: z.string().optional(),
    parameters: jsonSchemaObject.optional().describe('A JSON Schema (the subset response_format takes, enforced when the call is forced).'),
    strict: z.boolean().nullable().optional(),
  }),
});

const toolChoice = z.union([
  z.enum(['none', 'auto', 'required']),
  z.strictObject({ type: z.literal('function'), function: z.strictObject({ name: z.string() }) }),
]).describe('auto (the default with tools), none, required or a named function: the last two are generated under the call\'s schema.');

/** The grounding extension of /v1/chat/completions: retrieve on the last user message, answer from the hits. */
function ragExtension(cfg: Config) {
  return z.strictObject({
    top_k: z.number().int().min(1).max(cfg.maxTopK).default(cfg.defaultTopK).describe('Hits retrieved from the index.'),
    rerank_top_n: z.number().int().min(1).max(cfg.maxRerankTopN).default(cfg.defaultRerankTopN).describe('Hits kept after reranking, placed in the prompt.'),
    collection: collectionSchema.optional(),
    filter: filterSchema.optional(),
  }).describe('ragguard extension: ground the answer on the index; the reply carries `citations`.');
}

function openaiCommon(cfg: Config) {
  const { _maxTokens, ...s } = sampling(cfg);
  return {
    model: z.string().min(1).describe('A model id from GET /v1/models.'),
    max_tokens: _maxTokens.optional(),
    top_k: tokenTopK,
    n: z.number().int().min(1).max(cfg.maxN).optional()
      .describe('Samples of the prompt (RAGGUARD_MAX_N at most): the prompt is prefilled once and its KV shared; with a seed, sample i is seeded seed + i.'),
    user: z.string().optional().describe('Accepted, not used.'),
    ignore_eos: z.boolean().optional().describe('Generate max_tokens tokens past any end-of-sequence token (vLLM\'s and llama.cpp\'s extension; benchmarks).'),
    stream_options: z.strictObject({ include_usage: z.boolean().optional() }).optional()
      .describe('include_usage: a last chunk with the usage (and no choices) before [DONE].'),
    ...s,
  };
}

export function chatCompletionSchema(cfg: Config) {
  return z.strictObject({
    messages: z.array(message).min(1),
    max_completion_tokens: z.number().int().min(1).max(cfg.maxNewTokensLimit).optional().describe('The same as max_tokens (OpenAI\'s newer name).'),
    rag: ragExtension(cfg).optional(),
    tools: z.array(tool).min(1).max(128).optional(),
    tool_choice: toolChoice.optional(),
    parallel_tool_calls: z.boolean().optional().describe('Accepted: auto may call several; a forced call is one.'),
    logprobs: z.boolean().optional().describe('Each output token\'s logprob: the log-softmax of the model\'s raw logits (before penalties and temperature, as vLLM\'s default).'),
    top_logprobs: z.number().int().min(0).max(MAX_TOP_LOGPROBS).optional().describe('The most likely alternatives at each position (needs logprobs: true).'),
    ...openaiCommon(cfg),
  }).refine((b) => b.top_logprobs === undefined || b.logprobs === true, { message: 'top_logprobs needs logprobs: true', path: ['top_logprobs'] });
}

export function completionSchema(cfg: Config) {
  return z.strictObject({
    prompt: z.union([z.string(), z.array(z.string()).length(1)]).describe('A text (or a list of one).'),
    logprobs: z.number().int().min(0).max(MAX_TOP_LOGPROBS).optional()
      .describe('Each output token\'s logprob and this many most likely alternatives (log-softmax of the raw logits).'),
    ...openaiCommon(cfg),
  });
}

const tokenIds = z.array(z.number().int().min(0)).min(1);

export const embeddingSchema = z.strictObject({
  model: z.string().min(1),
  input: z.union([z.string(), z.array(z.string()).min(1).max(2048), tokenIds, z.array(tokenIds).min(1).max(2048)])
    .describe('Texts, or token ids of the embedder\'s own vocabulary (as vLLM takes them: fed as they are, no special tokens added; ' +
      'not the cl100k ids that LangChain\'s OpenAIEmbeddings sends by default: set check_embedding_ctx_length=False there to send text).'),
  dimensions: z.number().int().min(1).optional().describe('Accepted only where it is the embedder\'s own dimension (it cannot shorten its vectors).'),
  encoding_format: z.enum(['float', 'base64']).optional(),
  user: z.string().optional().describe('Accepted, not used.'),
});

/** Documents per /v1/rerank or pairs per /v1/score request. */
export const MAX_RERANK_DOCUMENTS = 1000;

const rerankText = z.string().min(1);

export const rerankSchema = z.strictObject({
  model: z.string().min(1).optional().describe('The reranker\'s id (GET /v1/models); absent: the reranker (as vLLM defaults it).'),
  query: rerankText,
  documents: z.union([z.array(rerankText).min(1).max(MAX_RERANK_DOCUMENTS), z.array(z.strictObject({ text: rerankText })).min(1).max(MAX_RERANK_DOCUMENTS)])
    .describe('Texts, or {text} objects (Jina\'s and Cohere\'s forms).'),
  top_n: z.number().int().min(1).optional().describe('Only the top_n most relevant (default: all), most relevant first.'),
  return_documents: z.boolean().optional().describe('Each result carries its document\'s {text} (default true).'),
});

const scoreTexts = z.union([rerankText, z.array(rerankText).min(1).max(MAX_RERANK_DOCUMENTS)]);

export const scoreSchema = z.strictObject({
  model: z.string().min(1).optional().describe('The reranker\'s id (GET /v1/models); absent: the reranker.'),
  text_1: scoreTexts.describe('A text (paired with each of text_2), or a list: one (paired with each of text_2) or as many as text_2 (paired in order).'),
  text_2: scoreTexts,
});

export type RerankBody = z.output<typeof rerankSchema>;
export type ScoreBody = z.output<typeof scoreSchema>;

/** Every route's body schema, built for this configuration (openapi.ts documents them). */
export function bodySchemas(cfg: Config) {
  return {
    query: querySchema(cfg),
    documents: documentsSchema,
    chatCompletion: chatCompletionSchema(cfg),
    completion: completionSchema(cfg),
    embedding: embeddingSchema,
    rerank: rerankSchema,
    score: scoreSchema,
  };
}

export type QueryBody = z.output<ReturnType<typeof querySchema>>;
export type ChatCompletionBody = z.output<ReturnType<typeof chatCompletionSchema>>;
export type CompletionBody = z.output<ReturnType<typeof completionSchema>>;
export type EmbeddingBody = z.output<typeof embeddingSchema>;

const fieldPath = (path: readonly PropertyKey[]) =>
  path.reduce<string>((s, k) => (typeof k === 'number' ? `${s}[${k}]` : s ? `${s}.${String(k)}` : String(k)), '');

/** A zod error as our field errors: one per unknown key, one per invalid field. */
export function fieldErrors(error: z.ZodError): FieldError[] {
  const out: FieldError[] = [];
  for (const issue of error.issues) {
    const at = fieldPath(issue.path);
    if (issue.code === 'unrecognized_keys') {
      for (const k of issue.keys) out.push({ field: at ? `${at}.${k}` : k, code: 'unknown_field', message: `unknown field '${k}'` });
    } else if (issue.code === 'invalid_union') {
      // A union's branches each failed: name the field once, with the first branch's reason.
      const first = issue.errors[0]?.[0];
      out.push({ field: at, code: at ? 'invalid_field' : 'invalid_body', message: first ? `${at || 'body'}: ${first.message}` : issue.message });
    } else {
      out.push({ field: at, code: at ? 'invalid_field' : 'invalid_body', message: `${at || 'body'}: ${issue.message}` });
    }
  }
  return out;
}

/** The parsed body, or a 400 invalid_body listing every problem. */
export function parseBody<S extends z.ZodType>(schema: S, body: unknown): z.output<S> {
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const errors = fieldErrors(r.error);
  const message = errors.length === 1 ? errors[0]!.message : `${errors.length} problems: ${errors.map((e) => e.message).join('; ')}`;
  throw new HttpError(400, 'invalid_body', message, { errors, ...(errors[0]?.field ? { param: errors[0].field } : {}) });
}
